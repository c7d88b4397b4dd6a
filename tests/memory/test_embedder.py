"""The memory's embedder: our JAX BERT forward against sentence-transformers (MiniLM, mean
pooling) and against transformers (a random BERT with [CLS] pooling, bge's layout); the floor's
calibration against a brute-force reference."""

import json
import os
import shutil

import numpy as np
import pytest

from rubric_rl.memory import calibrate
from rubric_rl.memory.embedder import (
    FLOORS,
    BertSentenceEmbedder,
    floor_for,
    make_embedder,
    minilm_dir,
)

TEXTS = [
    "the response lists exactly 5 items",
    "The answer lists exactly three items.",
    "every word is one of the animals",
    "",
    "Écrivez tout en MAJUSCULES, s'il vous plaît — merci!",
    "the response opens by praising the question , like great question",
    "word " * 400,  # longer than max_seq_length (256): truncated, as sentence-transformers does
]


@pytest.fixture(scope="module")
def minilm():
    return make_embedder("minilm")


def test_minilm_matches_sentence_transformers(minilm):
    from sentence_transformers import SentenceTransformer

    ours = minilm.embed(TEXTS)
    ref = SentenceTransformer(minilm_dir(), device="cpu").encode(
        TEXTS, normalize_embeddings=True, convert_to_numpy=True
    )
    assert ours.shape == (len(TEXTS), 384) and ours.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-6)
    np.testing.assert_allclose(ours, ref, atol=2e-6)
    assert minilm.name == "all-MiniLM-L6-v2" and minilm.dim == 384


def test_an_embedding_does_not_depend_on_its_batch(minilm):
    """Padding and batch composition leave a text's embedding unchanged."""
    alone = np.stack([minilm.embed([t])[0] for t in TEXTS[:3]])
    together = minilm.embed(TEXTS)[:3]
    np.testing.assert_allclose(alone, together, atol=1e-6)
    assert minilm.embed([]).shape == (0, 384)


def test_one_requirement_kind_clears_the_floor_and_another_does_not(minilm):
    a, b, c = minilm.embed(
        ["the response lists exactly 5 items", "the response lists exactly 3 items", TEXTS[2]]
    )
    assert a @ b > FLOORS["all-MiniLM-L6-v2"] > a @ c


def test_cls_pooling_and_prefixed_weights_match_transformers(tmp_path):
    """bge-base's layout ([CLS] pooling) on a random BERT, saved with the ``bert.`` prefix of a
    task head, against transformers' own forward pass."""
    import torch
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=30522, hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=96, max_position_embeddings=128, hidden_act="gelu",
    )  # fmt: skip
    model = BertForMaskedLM(cfg).eval()
    d = tmp_path / "bert-cls"
    model.save_pretrained(d)
    shutil.copy(os.path.join(minilm_dir(), "tokenizer.json"), d / "tokenizer.json")
    (d / "1_Pooling").mkdir()
    (d / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": 48, "pooling_mode_cls_token": True})
    )
    emb = BertSentenceEmbedder(str(d), name="bge-like")
    assert emb.pooling == "cls" and emb.max_len == 128
    texts = TEXTS[:6]
    ours = emb.embed(texts)
    for i, t in enumerate(texts):
        ids = torch.tensor([emb.tokenizer.encode(t).ids])
        with torch.no_grad():
            h = model.bert(input_ids=ids).last_hidden_state[0, 0].numpy()
        np.testing.assert_allclose(ours[i], h / np.linalg.norm(h), atol=2e-5)


def test_bad_embedder_specs_and_floors_name_the_flag(tmp_path):
    with pytest.raises(ValueError, match="memory.embedder='nope'"):
        make_embedder("nope")
    with pytest.raises(FileNotFoundError, match="is not a directory"):
        make_embedder(f"bge-base:{tmp_path / 'missing'}")
    with pytest.raises(FileNotFoundError, match="config.json, model.safetensors"):
        BertSentenceEmbedder(str(tmp_path))

    class Unknown:
        name, dim = "my-embedder", 8

    with pytest.raises(ValueError, match="memory.floor is not set"):
        floor_for(Unknown())
    assert floor_for(Unknown(), 0.5) == 0.5
    with pytest.raises(ValueError, match=r"memory.floor=1.5"):
        floor_for(Unknown(), 1.5)


def test_fbeta_floor_against_a_brute_force_reference():
    rng = np.random.default_rng(0)
    n = 40
    labels = rng.integers(0, 4, n)
    centers = rng.normal(size=(4, 6))
    x = centers[labels] + 0.9 * rng.normal(size=(n, 6))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    got = calibrate.fbeta_floor(x, labels.astype(str), beta=0.5)
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    cos = np.array([x[i] @ x[j] for i, j in pairs])
    pos = np.array([labels[i] == labels[j] for i, j in pairs])

    def f_half(t):
        sel = cos >= t
        p, r = pos[sel].mean(), (sel & pos).sum() / pos.sum()
        return 1.25 * p * r / (0.25 * p + r) if (sel & pos).any() else 0.0

    best = max((f_half(t), t) for t in np.unique(cos))
    assert got["f_beta"] == pytest.approx(best[0], abs=1e-12)
    # The floor retrieves exactly the pairs the best threshold retrieves.
    assert ((cos >= got["floor"]) == (cos >= best[1])).all()
    assert got["related_pairs"] == pos.sum() and got["unrelated_pairs"] == (~pos).sum()
    with pytest.raises(ValueError, match="need both"):
        calibrate.fbeta_floor(x[:3], ["a", "b", "c"])


def test_the_minilm_floor_is_the_calibrated_one(minilm):
    """FLOORS records what the calibration gives on the training split (200 tasks, seed 0)."""
    rows = calibrate.domain_criterion_texts(200, 0)
    got = calibrate.fbeta_floor(minilm.embed([r[0] for r in rows]), [r[1] for r in rows])
    assert got["floor"] == pytest.approx(FLOORS["all-MiniLM-L6-v2"], abs=0.005)
    assert got["precision"] > 0.4 and got["recall"] > 0.25
