"""Tool environments as training domains: splits, verifiers, the exact-decoding embedded
tokenizer and its vocabulary, the agent loop's tokens against the warm-start corpus, config
variants and validation."""

import hashlib
import json
import random

import numpy as np
import pytest

from configs import common, grpo
from rubric_rl.config import builders, config_validation
from rubric_rl.envs import constraints, tool_domain
from rubric_rl.envs.inventory import InventoryEnv
from rubric_rl.envs.sql import SqlEnv
from rubric_rl.envs.tool_envs import ENVS
from rubric_rl.envs.trajectory import score_rules, transcript_of
from rubric_rl.pre_rl.warmstart import encode_corpus
from rubric_rl.rollout.agent import AgentConfig, ChatFormat, run_agent
from rubric_rl.rollout.engine import SamplingParams
from rubric_rl.rollout.scripted import TurnScriptEngine

NAMES = tool_domain.TOOL_DOMAINS
SPLITS = ("train", "heldout", "ood")


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    root = tmp_path_factory.mktemp("tok")
    return {
        n: builders.build_spaced_tokenizer(tool_domain.vocabulary(n), str(root / n)) for n in NAMES
    }


def _config(name, variant="smoke"):
    return grpo.get_config(f"{variant},domain={name}" if variant else f"domain={name}")


def _play(name, task, turns):
    """The transcript after stepping ``turns`` (stops when the env is done)."""
    env = ENVS.get(name)()
    env.reset(task)
    for turn in turns:
        if env.step(turn).done:
            break
    return env.response()


# ------------------------------------------------------------------------------ the domain


@pytest.mark.parametrize("name, env_cls", [("sql", SqlEnv), ("inventory", InventoryEnv)])
def test_domain_builds_splits_and_fresh_envs(name, env_cls):
    c = _config(name)
    common.validate_config(c, num_devices=1)
    d = builders.build_domain(c)
    assert (len(d.train), len(d.heldout), len(d.ood)) == (32, 8, 8)
    assert d.name == name and d.embedded_tokenizer == "spaced"
    assert d.train == tuple(env_cls.task_bank("train", 32, 0))  # the env's own banks
    for split, tasks in (("train", d.train), ("heldout", d.heldout), ("ood", d.ood)):
        assert {t.env_name for t in tasks} == {name}
        assert {t.task_type for t in tasks} == set(env_cls.task_types(split))
    # OOD = the task type never trained on.
    assert not {t.task_type for t in d.ood} & {t.task_type for t in d.train + d.heldout}
    assert not {t.id for t in d.train} & {t.id for t in d.heldout}
    a, b = d.make_env(d.train[0]), d.make_env(d.train[0])
    assert type(a) is env_cls and type(b) is env_cls and a is not b
    assert d.verify is tool_domain.VERIFIERS[name] and d.oracle is None
    assert d.corpus is not None
    assert tuple(d.vocabulary) == tool_domain.vocabulary(name)
    assert list(d.vocabulary) == sorted(set(d.vocabulary))
    # Deterministic and independent of the run's seed or sizes (recomputed without the cache).
    assert tool_domain.vocabulary.__wrapped__(name) == tool_domain.vocabulary(name)
    c2 = _config(name, variant="")
    c2.domain.update(seed=3, n_train=5)
    assert builders.build_domain(c2).vocabulary == d.vocabulary


def test_constraint_domain_is_single_turn():
    d = builders.build_domain(grpo.get_config("smoke"))
    assert d.make_env is None and d.embedded_tokenizer == "word"
    assert config_validation.rollout_mode(grpo.get_config("smoke")) == "single"
    assert config_validation.rollout_mode(_config("sql")) == "agent"


# ------------------------------------------------------------------------------ verifiers


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("split", SPLITS)
def test_reference_solution_is_verified(name, split):
    cls = ENVS.get(name)
    for task in cls.task_bank(split, 20, 0):
        assert tool_domain.VERIFIERS[name](task, _play(name, task, cls.reference_turns(task)))


def test_sql_verifier_rejects_wrong_or_missing_answers():
    verify = tool_domain.verify_sql
    for task in SqlEnv.task_bank("train", 12, 0):
        ref = SqlEnv.reference_turns(task)
        expected = task.raw["expected"]
        wrong = [v + 1 if isinstance(v, int | float) else v + "x" for v in expected]
        assert not verify(
            task, _play("sql", task, [*ref[:-1], "Answer: " + ", ".join(map(str, wrong))])
        )
        assert not verify(task, _play("sql", task, ref[:-1]))  # no final answer yet
        # The outcome decides, not the path: the right answer without any query passes.
        assert verify(task, _play("sql", task, [ref[-1]]))
        if len(expected) > 1:  # ordered lists: the order counts
            assert not verify(
                task, _play("sql", task, ["Answer: " + ", ".join(map(str, expected[::-1]))])
            )


def _inventory_tasks(task_type, n=40):
    return [t for t in InventoryEnv.task_bank("train", n, 0) if t.task_type == task_type] or [
        t for t in InventoryEnv.task_bank("ood", n, 0) if t.task_type == task_type
    ]


@pytest.mark.parametrize(
    "task_type", ["cheapest_match", "best_rated_under", "named_items", "budget_max"]
)
def test_inventory_verifier_needs_the_order_and_the_answer(task_type):
    from rubric_rl.envs.tool_calls import render_tool_call

    verify = tool_domain.verify_inventory
    for task in _inventory_tasks(task_type)[:3]:
        ref = InventoryEnv.reference_turns(task)
        answer_only = [ref[-1]]
        assert not verify(task, _play("inventory", task, answer_only))  # nothing bought
        assert not verify(task, _play("inventory", task, [*ref[:-1], "Answer: 0.01"]))
        # One more unit of the first item: a different order (and total).
        iid, q = task.raw["order"][0]
        extra = [
            render_tool_call("search", {"query": "x"}),
            render_tool_call("add_to_cart", {"item_id": iid, "quantity": q + 1}),
            render_tool_call("checkout"),
            ref[-1],
        ]
        assert not verify(task, _play("inventory", task, extra))
        # The right items in two orders are not "a single order" (split when splittable).
        order = [tuple(p) for p in task.raw["order"]]
        if len(order) > 1:
            parts = [order[:1], order[1:]]
        elif order[0][1] > 1:
            parts = [[(iid, q - 1)], [(iid, 1)]]
        else:
            continue
        split_turns = list(ref[:-3])  # searches and lookups
        for part in parts:
            split_turns.append(
                "\n".join(
                    render_tool_call("add_to_cart", {"item_id": i, "quantity": n}) for i, n in part
                )
            )
            split_turns.append(render_tool_call("checkout"))
        response = _play("inventory", task, [*split_turns, ref[-1]])
        assert len(transcript_of(response).state["orders"]) == 2
        assert not verify(task, response)


def test_inventory_stock_question_must_not_buy():
    from rubric_rl.envs.tool_calls import render_tool_call

    task = _inventory_tasks("stock_query")[0]
    ref = InventoryEnv.reference_turns(task)
    assert tool_domain.verify_inventory(task, _play("inventory", task, ref))
    item = task.raw["plan"]["lookup"][0]
    buy = [
        render_tool_call("add_to_cart", {"item_id": item, "quantity": 1}),
        render_tool_call("checkout"),
    ]
    if task.raw["answer"] > 0:
        assert not tool_domain.verify_inventory(
            task, _play("inventory", task, [*ref[:-1], *buy, ref[-1]])
        )


def test_inventory_verifier_enforces_the_budget():
    task = next(t for t in _inventory_tasks("cheapest_match") if t.raw["budget_cents"])
    tight = dict(task.raw, budget_cents=1)  # the same episode, judged against a smaller budget
    response = _play("inventory", task, InventoryEnv.reference_turns(task))
    assert tool_domain.verify_inventory(task, response)
    import dataclasses

    assert not tool_domain.verify_inventory(dataclasses.replace(task, raw=tight), response)


# ------------------------------------------------------------------------------ tokenizer


def test_constraint_tokenizer_is_unchanged(tmp_path):
    """The embedded default keeps its ids bit for bit (pinned: the vocabulary as (token, id)
    pairs and the chat template; the tool domains never change it). It includes the four
    words of the implicit requirements' criterion texts: claim, item, praise, repeated."""
    tok = builders.build_word_tokenizer(constraints.domain_vocabulary(), str(tmp_path / "c"))
    pairs = sorted(tok.vocab().items(), key=lambda kv: kv[1])
    digest = hashlib.sha256(json.dumps(pairs).encode()).hexdigest()
    assert len(pairs) == 565
    assert digest == "2605c33d25bddb767d7c059e0edaa4536eeffbe32e35a74fc6a6fc9b0100db62"
    assert tok.hf.chat_template == (
        "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    assert "<|tool|>" not in tok.vocab()
    # The tool tokenizer's special tokens extend the default's with the same ids.
    tool = builders.build_spaced_tokenizer(tool_domain.vocabulary("sql"), str(tmp_path / "s"))
    for i, t in enumerate(builders.TOOL_SPECIAL_TOKENS):
        assert tool.vocab()[t] == i and (i >= len(builders.SPECIAL_TOKENS) or tok.vocab()[t] == i)


def _assert_covered(tok, text, where):
    pieces = [p for p, _ in tok.hf.backend_tokenizer.pre_tokenizer.pre_tokenize_str(text)]
    vocab = tok.vocab()
    missing = sorted({p for p in pieces if p not in vocab})
    assert not missing, f"{where}: units outside the vocabulary: {missing[:10]}"
    ids = tok.encode(text)
    assert tok.hf.unk_token_id not in ids, where
    assert tok.decode(ids, skip_special_tokens=False) == text, where


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("seed", [0, 7])
def test_vocabulary_covers_prompts_schemas_turns_and_tool_outputs(tokenizers, name, seed):
    """Every unit of every prompt (with the tool schemas), reference turn and tool output of 50
    tasks per split, and of the error probes, is a whole token: no <|unk|>, no character
    fallback, and decoding gives the text back exactly (tool-call JSON and SQL survive)."""
    tok = tokenizers[name]
    for k, text in enumerate(tool_domain.domain_texts(name, 50, seed)):
        _assert_covered(tok, text, f"{name} seed {seed} text {k}")


def test_spaced_tokenizer_round_trips_any_ascii(tokenizers):
    tok = tokenizers["sql"]
    rng = random.Random(0)
    alphabet = "".join(tool_domain.BASE_UNITS) + " \n\t"
    for _ in range(200):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 60)))
        ids = tok.encode(text)
        assert tok.hf.unk_token_id not in ids
        assert tok.decode(ids, skip_special_tokens=False) == text
    ids = tok.encode("Xyzzyq hire_year")  # unknown word: single characters, still exact
    assert tok.decode(ids, skip_special_tokens=False) == "Xyzzyq hire_year"


# ------------------------------------------------------------------------------ agent loop


@pytest.mark.parametrize("name", NAMES)
def test_agent_episodes_match_the_chat_template_and_the_measured_sizes(tokenizers, name):
    """Reference turns through run_agent with the embedded tokenizer: every episode is verified,
    its tokens are the chat template's rendering of the conversation (what the warm-start
    demonstrations are encoded from), and its sizes stay within EMBEDDED_SIZES and the
    ``domain=<name>`` variant's limits."""
    tok, cls = tokenizers[name], ENVS.get(name)
    c = _config(name, variant="")
    sizes = tool_domain.EMBEDDED_SIZES[name]
    tasks = [t for s in SPLITS for t in cls.task_bank(s, 50, 0)]
    scripts = [cls.reference_turns(t) for t in tasks]
    domain = builders.build_domain(_config(name))
    trajs = run_agent(
        TurnScriptEngine(tok, scripts),
        ChatFormat(tok, tools_in_system=bool(c.rollout.agent.tools_in_system)),
        [domain.make_env(t) for t in tasks],
        tasks,
        SamplingParams(n=1, max_new_tokens=int(c.rollout.max_new_tokens)),
        AgentConfig(
            max_turns=int(c.rollout.agent.max_turns),
            max_total_tokens=int(c.rollout.agent.max_total_tokens),
        ),
    )
    for task, script, tr in zip(tasks, scripts, trajs):
        assert tr.status == "stop" and tr.error is None, (task.id, tr.status, tr.error)
        assert domain.verify(task, tr.response)
        assert score_rules(task, tr.response)["answer_format"].met
        conv = [m for m, _, _ in tool_domain.replay(cls(), task, script)][-1]
        conv = conv + [{"role": "assistant", "content": script[-1]}]
        assert list(tr.token_ids) == tok.encode(tok.chat_text(conv, add_generation_prompt=False))
        model_turns = np.split(np.asarray(tr.loss_mask), np.flatnonzero(np.diff(tr.loss_mask)) + 1)
        assert max(len(s) for s in model_turns if s[0] == 1) <= sizes.turn
        assert tr.prompt_len <= min(sizes.prompt, int(c.model.max_prompt_len))
        assert len(tr.token_ids) <= sizes.episode and len(tr.turns) <= sizes.turns
    assert max(len(t.turns) for t in trajs) == sizes.turns  # the measured maxima are attained
    assert max(t.prompt_len for t in trajs) >= sizes.prompt - 4


# ------------------------------------------------------------------------------ warm start


@pytest.mark.parametrize("name", NAMES)
def test_warmstart_corpus_turns_and_imperfections(tokenizers, name):
    corpus = tool_domain.warmstart_corpus(name, 60, 0, 0.5)
    assert len(corpus) == 60 and corpus == tool_domain.warmstart_corpus(name, 60, 0, 0.5)
    assert corpus != tool_domain.warmstart_corpus(name, 60, 1, 0.5)
    for messages, turn in corpus:
        assert messages[0]["role"] == "system" and "<tools>" in messages[0]["content"]
        assert messages[1]["role"] == "user" and messages[-1]["role"] in ("user", "tool")
        assert turn.strip()
    finals = [t for _, t in corpus if "<tool_call>" not in t]
    perfect = tool_domain.warmstart_corpus(name, 60, 0, 1.0)
    sloppy = tool_domain.warmstart_corpus(name, 60, 0, 0.0)
    assert all(t.startswith("Answer: ") for _, t in perfect if "<tool_call>" not in t)
    assert not any(t.startswith("Answer: ") for _, t in sloppy if "<tool_call>" not in t)
    assert 0 < sum(t.startswith("Answer: ") for t in finals) < len(finals)
    if name == "sql":
        assert any('"list_tables"' in t for _, t in perfect)
        assert not any('"list_tables"' in t for _, t in sloppy)
    # Every demonstration fits the variant's warm-start shapes (none dropped, none cut).
    c = _config(name, variant="")
    tok = tokenizers[name]
    c_len = int(c.rollout.max_new_tokens)
    ids, _, lmask, dropped = encode_corpus(corpus, tok, int(c.warmstart.max_prompt_len), c_len)
    assert dropped == 0 and len(ids) == 60
    assert all(len(tok.encode(t)) + 1 <= c_len for _, t in corpus)


@pytest.mark.parametrize("name", NAMES)
def test_imperfect_demonstrations_keep_the_outcome(name):
    """A sloppy demonstration misses a stated step (criterion fails), never the outcome."""
    cls = ENVS.get(name)
    for task in cls.task_bank("train", 12, 0):
        turns = tool_domain._imperfect_turns(name, task, random.Random(0), 0.0)
        response = _play(name, task, turns)
        assert tool_domain.VERIFIERS[name](task, response)
        verdicts = score_rules(task, response)
        assert verdicts["answer_format"].met is False
        if name == "sql":
            assert verdicts["explored_schema"].met is False


# ------------------------------------------------------------------------------ config


@pytest.mark.parametrize("name", NAMES)
def test_domain_variants_validate(name):
    sizes = tool_domain.EMBEDDED_SIZES[name]
    for variant in ("smoke", ""):
        c = _config(name, variant)
        common.validate_config(c, num_devices=1)
        assert c.domain.name == name and c.rollout.mode == "agent"
        assert c.model.max_prompt_len == c.rollout.agent.max_total_tokens
    # The full variant: every reference episode, with a turn to spare, and every demonstration.
    assert c.rollout.agent.max_turns > sizes.turns
    assert c.rollout.agent.max_total_tokens >= sizes.episode + sizes.turn // 2
    assert c.warmstart.max_prompt_len >= sizes.episode
    with pytest.raises(ValueError, match="domain='nope'"):
        grpo.get_config("domain=nope")


@pytest.mark.parametrize(
    "field, value",
    [
        ("model.max_prompt_len", 256),
        ("rollout.max_new_tokens", 32),
        ("rollout.agent.max_total_tokens", 300),
        ("rollout.agent.max_turns", 0),
        ("rollout.agent.tools_in_system", False),
        ("warmstart.max_prompt_len", 460),
        ("rollout.mode", "multi"),
    ],
)
def test_validation_names_the_field(field, value):
    c = _config("sql")
    section, key = field.rsplit(".", 1)
    target = c
    for part in section.split("."):
        target = target[part]
    target[key] = value
    if field == "rollout.max_new_tokens":
        c.rollout.buckets = (32,)
    with pytest.raises(ValueError, match=f"config.{field}:"):
        common.validate_config(c, num_devices=1)


def test_domain_name_alone_says_which_limit_to_raise():
    c = grpo.get_config()
    c.domain.name = "sql"
    with pytest.raises(ValueError, match=r"config.model.max_prompt_len: 128 < 466 .*domain=sql"):
        common.validate_config(c, num_devices=1)
    c.rollout.mode = "single"  # a tool-free ablation needs no tool limits
    common.validate_config(c, num_devices=1)


def test_agent_mode_needs_a_tool_domain():
    c = grpo.get_config("smoke")
    c.rollout.mode = "agent"
    with pytest.raises(ValueError, match="config.rollout.mode: 'agent' needs a tool-environment"):
        common.validate_config(c, num_devices=1)


def test_checkpoint_tokenizer_skips_the_embedded_sizes(tmp_path):
    c = _config("sql")
    c.model.update(max_prompt_len=64, tokenizer=str(tmp_path))
    c.rollout.agent.tools_in_system = False
    common.validate_config(c, num_devices=1)  # sizes are checked when a prompt is encoded


def test_embedded_presets_agree():
    assert config_validation._EMBEDDED_PRESETS == builders.EMBEDDED_PRESETS
