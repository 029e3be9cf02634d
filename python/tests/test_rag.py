"""`engine.rag` on seed 003's synthetic personal corpus (`engram.synth_corpus`, the documents and
questions `engram bench rag` uses): answers from the documents with their sources, a repeated
question from the QA bank, and without the QA bank the chunks' KV from the tree, with the same
answer as the first."""

import pytest

import engram
from test_embed import encoder_installed


@pytest.fixture(scope="module")
def corpus():
    user = engram.synth_corpus(seed=3, users=1, topics_per_user=2, updates_per_user=0)[0]
    docs = [s["ingest"] for s in user["steps"] if "ingest" in s]
    queries = [s for s in user["steps"] if "query" in s]
    return docs, queries


def test_rag_answers_from_the_documents_and_reuses_its_caches(engine, corpus):
    docs, queries = corpus
    if not encoder_installed():
        with pytest.raises(engram.EngramError, match="RAG needs a text encoder"):
            engine.rag.add(docs)
        return
    reports = engine.rag.add(docs)
    assert [r["id"] for r in reports] == [d["id"] for d in docs]
    assert all(r["chunks_added"] > 0 for r in reports)
    assert sorted(d["id"] for d in engine.rag.documents()) == sorted(d["id"] for d in docs)
    q = next(x for x in queries if x["kind"] == "first")
    first = engine.rag.query(q["query"], max_tokens=32)
    assert first["object"] == "rag.answer" and first["answer"], first
    assert first["sources"] and set(first["sources"]) <= {d["id"] for d in docs}
    assert first["cache_level"] in ("none", "kv")
    again = engine.rag.query(q["query"], max_tokens=32)
    assert again["cache_level"] == "qa" and again["answer"] == first["answer"]
    tree = engine.rag.query(q["query"], max_tokens=32, use_qa=False)
    assert tree["cache_level"] == "kv" and tree["usage"]["cached_tokens"] > 0, tree
    assert tree["answer"] == first["answer"]
    # A removed document stops being a source.
    assert engine.rag.remove(docs[0]["id"]) > 0
    assert docs[0]["id"] not in [d["id"] for d in engine.rag.documents()]


def test_rag_bad_arguments(engine):
    if not encoder_installed():
        pytest.skip("no sentence encoder installed")
    with pytest.raises(ValueError, match="unknown document type"):
        engine.rag.add([{"id": "x", "text": "hello", "type": "pdf"}])
    with pytest.raises(ValueError, match="has no \"text\""):
        engine.rag.add([{"id": "x"}])
    with pytest.raises(ValueError, match="appears twice"):
        engine.rag.add([{"id": "x", "text": "a"}, {"id": "x", "text": "b"}])
    with pytest.raises(ValueError, match="max_tokens must be in"):
        engine.rag.query("hi", max_tokens=0)
