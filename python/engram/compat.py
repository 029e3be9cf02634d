"""llama-cpp-python's `Llama` over Engram, so existing code switches by its import:

    from engram.compat import Llama          # was: from llama_cpp import Llama
    llm = Llama(model_path="model.gguf", n_ctx=2048)
    out = llm.create_chat_completion(messages=[{"role": "user", "content": "Hi"}])

The subset: `Llama(model_path, n_ctx, n_threads, seed, verbose)`, `create_chat_completion`,
`create_completion` (and `__call__`), `tokenize`, `detokenize`, `save_state` / `load_state`,
`n_ctx`, `n_vocab`, `token_bos`, `token_eos`, `reset`, `close`. Results are the same
OpenAI-shaped dicts llama-cpp-python returns; the defaults are its own (chat temperature 0.2,
completion temperature 0.8, top_k 40, top_p 0.95, min_p 0.05, completion max_tokens 16).

KV state: Engram keeps and reuses caches itself (a prompt that extends an earlier one prefills
only its new tokens), so `save_state()` returns the tokens evaluated so far and `load_state()`
puts them back; no KV bytes travel through Python. A `Llama` runs on a private temporary data
directory (nothing persists, as with llama.cpp); for caches that outlive the process use
`engram.Engine(data_dir=...)` and its agents.
"""

import contextlib
import os
import random
import shutil
import sys
import tempfile
from typing import Any, Dict, Iterator, List, Optional, Sequence, Union

from . import Engine

LLAMA_DEFAULT_SEED = 0xFFFFFFFF

# llama.cpp's own knobs: accepted so existing constructor calls run, without effect here.
_IGNORED_INIT = {
    "n_gpu_layers", "split_mode", "main_gpu", "tensor_split", "vocab_only", "use_mmap",
    "use_mlock", "kv_overrides", "n_batch", "n_ubatch", "n_threads_batch", "rope_scaling_type",
    "pooling_type", "rope_freq_base", "rope_freq_scale", "yarn_ext_factor", "yarn_attn_factor",
    "yarn_beta_fast", "yarn_beta_slow", "yarn_orig_ctx", "logits_all", "embedding", "offload_kqv",
    "flash_attn", "no_perf", "last_n_tokens_size", "lora_base", "lora_scale", "lora_path",
    "numa", "chat_format", "chat_handler", "draft_model", "tokenizer", "type_k", "type_v",
    "spm_infill", "swa_full", "op_offload",
}


class LlamaState:
    """What `Llama.save_state` returns: the tokens evaluated so far (the KV cache itself stays
    in Engram's engine, which reuses it for any prompt that extends these tokens)."""

    def __init__(self, input_ids: List[int], n_tokens: int, seed: int):
        self.input_ids = list(input_ids)
        self.n_tokens = n_tokens
        self.seed = seed
        self.llama_state = b""
        self.llama_state_size = 0


@contextlib.contextmanager
def _quiet(enabled: bool):
    """Silences the process's stderr (file descriptor 2: Rust writes there directly) while
    `enabled`, as llama-cpp-python does for `verbose=False`."""
    if not enabled:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


class Llama:
    """A model loaded in Engram with llama-cpp-python's API (see the module doc)."""

    def __init__(
        self,
        model_path: str,
        *,
        n_ctx: int = 512,
        n_threads: Optional[int] = None,
        seed: int = LLAMA_DEFAULT_SEED,
        verbose: bool = True,
        **kwargs: Any,
    ):
        unknown = sorted(set(kwargs) - _IGNORED_INIT)
        if unknown:
            raise TypeError(f"Llama() got an unexpected keyword argument '{unknown[0]}'")
        if not isinstance(n_ctx, int) or n_ctx < 0:
            raise ValueError(f"n_ctx must be an int >= 0 (0: the model's own context), got {n_ctx!r}")
        self.model_path = str(model_path)
        self.verbose = verbose
        self._seed = seed
        self._dir = tempfile.mkdtemp(prefix="engram-compat-")
        try:
            with _quiet(not verbose):
                self._engine = Engine(model=self.model_path, data_dir=self._dir, threads=n_threads)
        except BaseException:
            shutil.rmtree(self._dir, ignore_errors=True)
            raise
        ctx = self._engine.context_length
        self._n_ctx = ctx if n_ctx == 0 else min(n_ctx, ctx)
        self.input_ids: List[int] = []
        self.n_tokens = 0

    # -- tokens --------------------------------------------------------------------------

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False) -> List[int]:
        """The token ids of UTF-8 `text` (`add_bos`: with the model's BOS rule)."""
        if isinstance(text, str):
            raise TypeError("tokenize() takes bytes (as llama-cpp-python); encode the str first")
        return self._engine.tokenize(bytes(text).decode("utf-8", errors="replace"), add_special=add_bos)

    def detokenize(self, tokens: List[int], prev_tokens: Optional[List[int]] = None, special: bool = False) -> bytes:
        """The UTF-8 bytes of `tokens` (after `prev_tokens`, when given)."""
        if prev_tokens:
            whole = self._engine.detokenize(list(prev_tokens) + list(tokens), skip_special=not special)
            head = self._engine.detokenize(list(prev_tokens), skip_special=not special)
            return whole[len(head):].encode("utf-8") if whole.startswith(head) else whole.encode("utf-8")
        return self._engine.detokenize(list(tokens), skip_special=not special).encode("utf-8")

    def n_ctx(self) -> int:
        """The context window (`n_ctx`, at most the model's)."""
        return self._n_ctx

    def n_vocab(self) -> int:
        """Tokens in the vocabulary."""
        return self._engine.vocab_size

    def token_bos(self) -> int:
        """The BOS token id (-1 if none)."""
        t = self._engine.bos_token_id
        return -1 if t is None else t

    def token_eos(self) -> int:
        """The EOS token id (-1 if none)."""
        t = self._engine.eos_token_id
        return -1 if t is None else t

    # -- generation ----------------------------------------------------------------------

    def _options(self, n_prompt: int, max_tokens, temperature, top_p, top_k, min_p, stop, seed,
                 frequency_penalty, presence_penalty, repeat_penalty) -> Dict[str, Any]:
        room = self._n_ctx - n_prompt
        if room <= 0 or (max_tokens is not None and max_tokens > 0 and n_prompt + max_tokens > self._n_ctx):
            raise ValueError(f"Requested tokens ({n_prompt + max(max_tokens or 0, 0)}) exceed context window of {self._n_ctx}")
        if max_tokens is None or max_tokens <= 0:
            max_tokens = room
        seed = self._seed if seed is None else seed
        if seed == LLAMA_DEFAULT_SEED or seed < 0:
            seed = random.getrandbits(32)
        return dict(max_tokens=max_tokens, temperature=max(float(temperature), 0.0), top_p=top_p, top_k=top_k,
                    min_p=min_p, stop=stop or None, seed=seed, frequency_penalty=frequency_penalty,
                    presence_penalty=presence_penalty, repetition_penalty=repeat_penalty)

    def _relabel(self, out, model: Optional[str]):
        name = model or self.model_path
        if isinstance(out, dict):
            out["model"] = name
            return out
        return self._relabel_stream(out, name)

    @staticmethod
    def _relabel_stream(chunks, name: str) -> Iterator[Dict[str, Any]]:
        for c in chunks:
            c["model"] = name
            yield c

    def _remember(self, prompt_ids: Sequence[int], out) -> None:
        if isinstance(out, dict):
            c = out["choices"][0]
            text = c["message"]["content"] if "message" in c else c["text"]
            self.input_ids = list(prompt_ids) + self._engine.tokenize(text or "")
            self.n_tokens = len(self.input_ids)

    def create_completion(
        self,
        prompt: Union[str, List[int]],
        suffix: Optional[str] = None,
        max_tokens: Optional[int] = 16,
        temperature: float = 0.8,
        top_p: float = 0.95,
        min_p: float = 0.05,
        typical_p: float = 1.0,
        logprobs: Optional[int] = None,
        echo: bool = False,
        stop: Optional[Union[str, List[str]]] = [],
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        repeat_penalty: float = 1.0,
        top_k: int = 40,
        stream: bool = False,
        seed: Optional[int] = None,
        model: Optional[str] = None,
        **kwargs: Any,
    ):
        """A `text_completion` dict (or with `stream=True` an iterator of chunks), as
        llama-cpp-python's."""
        if suffix is not None:
            raise ValueError("engram.compat: suffix (infill) is not supported")
        ids = self.tokenize(prompt.encode("utf-8")) if isinstance(prompt, str) else list(prompt)
        opts = self._options(len(ids), max_tokens, temperature, top_p, top_k, min_p, stop, seed,
                             frequency_penalty, presence_penalty, repeat_penalty)
        out = self._engine.complete(prompt, stream=stream, logprobs=logprobs, **opts)
        if echo and isinstance(out, dict) and isinstance(prompt, str):
            out["choices"][0]["text"] = prompt + out["choices"][0]["text"]
        self._remember(ids, out)
        return self._relabel(out, model)

    def __call__(self, prompt: Union[str, List[int]], *args: Any, **kwargs: Any):
        """`create_completion`."""
        return self.create_completion(prompt, *args, **kwargs)

    def create_chat_completion(
        self,
        messages: List[Dict[str, Any]],
        functions: Optional[list] = None,
        function_call: Optional[Any] = None,
        tools: Optional[list] = None,
        tool_choice: Optional[Any] = None,
        temperature: float = 0.2,
        top_p: float = 0.95,
        top_k: int = 40,
        min_p: float = 0.05,
        typical_p: float = 1.0,
        stream: bool = False,
        stop: Optional[Union[str, List[str]]] = [],
        seed: Optional[int] = None,
        response_format: Optional[Dict[str, Any]] = None,
        max_tokens: Optional[int] = None,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        repeat_penalty: float = 1.0,
        model: Optional[str] = None,
        logprobs: Optional[bool] = None,
        top_logprobs: Optional[int] = None,
        **kwargs: Any,
    ):
        """A `chat.completion` dict (or with `stream=True` an iterator of chunks), the messages
        rendered with the model's own chat template, as llama-cpp-python's."""
        if functions or tools:
            raise ValueError("engram.compat: functions and tools are not supported")
        prompt = self._engine.apply_chat_template(messages)
        ids = self._engine.tokenize(prompt)
        opts = self._options(len(ids), max_tokens, temperature, top_p, top_k, min_p, stop, seed,
                             frequency_penalty, presence_penalty, repeat_penalty)
        out = self._engine.chat(messages, stream=stream, response_format=response_format, logprobs=logprobs,
                                top_logprobs=top_logprobs if logprobs else None, **opts)
        self._remember(ids, out)
        return self._relabel(out, model)

    # -- state -------------------------------------------------------------------------

    def save_state(self) -> LlamaState:
        """The tokens evaluated so far (their KV stays cached in the engine)."""
        return LlamaState(self.input_ids, self.n_tokens, self._seed)

    def load_state(self, state: LlamaState) -> None:
        """Puts back the tokens `save_state` returned; a prompt extending them reuses their
        cache."""
        self.input_ids = list(state.input_ids)
        self.n_tokens = state.n_tokens
        self._seed = state.seed

    def reset(self) -> None:
        """Forgets the evaluated tokens (caches stay reusable)."""
        self.input_ids = []
        self.n_tokens = 0

    def set_seed(self, seed: int) -> None:
        """The seed of calls that name none."""
        self._seed = seed

    def close(self) -> None:
        """Stops the engine and removes the temporary data directory."""
        eng = getattr(self, "_engine", None)
        if eng is not None:
            eng.close()
            self._engine = None
        shutil.rmtree(getattr(self, "_dir", ""), ignore_errors=True) if getattr(self, "_dir", None) else None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
