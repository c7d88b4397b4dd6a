"""The constraint domain's task writer (ARISE-RL's generator domain): the output format round
trip, malformed answers, the lookup tool through the agent loop (R_tool), and the generator's
vocabulary."""

import dataclasses

import numpy as np
import pytest

from rubric_rl.envs.constraint_domain import (
    ConstraintDomain,
    hard_constraints,
    render_response,
    task_requirements,
    verify,
)
from rubric_rl.envs.constraint_lexicon import CATEGORIES, domain_vocabulary, units
from rubric_rl.envs.constraint_library import library_criteria
from rubric_rl.envs.constraint_writer import (
    GENERATOR_TASK_TYPES,
    GENERATOR_UNITS,
    REASONS,
    ConstraintTaskWriter,
    GeneratorEnv,
    forbidden_signatures,
    format_generated,
    generator_task,
    generator_vocabulary,
    lookup_text,
    normalise_tool_calls,
    parse_generated,
    role_prompt,
    source_question,
)
from rubric_rl.envs.constraint_writer_corpus import (
    EMBEDDED_TURN_END,
    add_generator_demonstrations,
    demonstration_turns,
    generator_corpus,
    generator_demonstration,
    with_generator_demonstrations,
)
from rubric_rl.envs.tool_calls import render_tool_call
from rubric_rl.methods.arise_rl.arise_rl_domain import GeneratorRole, gate_outcome
from rubric_rl.methods.arise_rl.arise_rl_rewards import r_fmt, r_tool, tool_observed
from rubric_rl.rollout.agent import AgentConfig, ChatFormat, run_agent
from rubric_rl.rollout.engine import SamplingParams
from rubric_rl.rollout.scripted import TurnScriptEngine

SPECIALS = ("<|eos|>", "<|tool|>", "<|assistant|>", "<|system|>", "<|user|>")

# An episode's parse with the gates' input, as ARISE-RL's controller sees it.
episode_outcome = GeneratorRole(ConstraintTaskWriter(observed=tool_observed)).episode_outcome


@pytest.fixture(scope="module")
def train_tasks():
    return [
        t for t in ConstraintDomain(0).tasks("train", 240) if t.task_type in GENERATOR_TASK_TYPES
    ]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from rubric_rl.config.builders import build_word_tokenizer

    return build_word_tokenizer(generator_vocabulary(), str(tmp_path_factory.mktemp("tok")))


# --- round trip -----------------------------------------------------------------------------


def test_demonstrations_parse_back_to_their_source_task(train_tasks):
    assert {t.task_type for t in train_tasks} == set(GENERATOR_TASK_TYPES)
    for i, source in enumerate(train_tasks):
        rng = np.random.default_rng(i)
        (call, final), _ = demonstration_turns(source, rng)
        g = parse_generated(final)
        assert g.reason is None and g.task is not None, (final, g.reason)
        task = g.task
        assert hard_constraints(task) == hard_constraints(source)
        assert task_requirements(task) == task_requirements(source)
        assert task.prompt[-1].content == source.prompt[-1].content
        assert task.task_type == source.task_type and task.capabilities == source.capabilities
        # the verifier agrees with the source's on its reference and on imperfect answers
        assert verify(task, source.reference_answer)
        for k in range(3):
            kinds = [c.kind for c in task_requirements(source)]
            keep = {kd for kd in kinds if rng.random() < 0.5}
            bad = render_response(source, keep, rng, praise=bool(k == 2))
            assert verify(task, bad) == verify(source, bad)
        # the rubric is the library's criteria the answer lists, completed with every other
        # library criterion of the question (the task verifier's full requirement set):
        # checkers, not free text
        lib = {c.id: c for c in library_criteria(source)}
        listed = [c.text for c in task.rubric.criteria if c.origin == "generator"]
        assert final.count("<criterion>") == len(listed) == g.num_listed
        assert {c.id for c in task.rubric.criteria} == set(lib)
        assert g.num_completed == len(lib) - len(listed)
        as_written = parse_generated(final, complete=False).task
        assert [c.text for c in as_written.rubric.criteria] == listed
        # an answer listing a single criterion is completed the same way
        one = parse_generated(format_generated(source_question(source), listed[:1]))
        assert {c.id for c in one.task.rubric.criteria} == set(lib)
        for c in task.rubric.criteria:
            assert c.verifier.kind == "rule"
            assert c.origin == ("generator" if c.text in listed else "implied")
            assert (c.text, c.weight, c.verifier) == (
                lib[c.id].text,
                lib[c.id].weight,
                lib[c.id].verifier,
            )
        assert {c.kind for c in hard_constraints(source)} <= {c.title for c in task.rubric.criteria}
        assert g.num_unknown == 0 and r_fmt(gate_outcome(g, True)) == 1.0


def test_parsed_task_is_stable_and_has_a_reference(train_tasks):
    final = format_generated("list 3 fruits . use uppercase", ["every word is in uppercase"])
    a, b = parse_generated(final), parse_generated(final)
    assert a.task.id == b.task.id and a.task.id.startswith("cf-generated-")
    ids = [c.id for c in a.task.rubric.criteria]
    assert ids[0] == "case:upper" and set(ids) == {c.id for c in library_criteria(a.task)}
    as_written = parse_generated(final, complete=False).task
    assert [c.id for c in as_written.rubric.criteria] == ["case:upper"]
    assert a.task.reference_answer is not None and verify(a.task, a.task.reference_answer)
    # contradictory clauses still parse (R_fmt 1); no reference, and the solver's c says the rest
    g = parse_generated(
        format_generated(
            "write 3 words about animals . start with cat . do not use cat",
            ["the response has exactly 3 words"],
        )
    )
    assert g.reason is None and g.task.reference_answer is None


# --- malformed answers ----------------------------------------------------------------------

Q = "<question> list 3 fruits </question>"
C = "<rubric> <criterion> the response lists exactly 3 items </criterion> </rubric>"
MALFORMED = [
    ("", "no_question"),
    ("list 3 fruits", "no_question"),
    ("<question> list 3 fruits " + C, "no_question"),
    ("<question> </question> " + C, "empty_question"),
    (Q, "no_rubric"),
    (Q + " <rubric> <criterion> the response lists exactly 3 items </criterion>", "no_rubric"),
    (Q + " <rubric> </rubric>", "empty_rubric"),
    (Q + " <rubric> <criterion> </criterion> </rubric>", "empty_rubric"),
    (Q + " <rubric> the response lists exactly 3 items </rubric>", "stray_rubric_text"),
    ("<question> sing 3 fruits </question> " + C, "unknown_head"),
    ("<question> list 3 dragons </question> " + C, "unknown_head"),
    ("<question> list 3 fruits . dance now </question> " + C, "unreadable_clause"),
    (
        "<question> list 3 fruits . use lowercase . use lowercase </question> " + C,
        "unreadable_clause",
    ),
    ("<question> what is 9 plus 19 ? </question> " + C, "unreadable_clause"),
    ("<question> what is 2 plus 3 ? include kiwi </question> " + C, "unsupported_clause"),
    (
        "<question> rewrite : cat dog in reverse order . number the items </question> " + C,
        "unsupported_clause",
    ),
    ("<question> list 30 fruits </question> " + C, "bad_count"),
    ("<question> list 0 fruits </question> " + C, "bad_count"),
    ("<question> from : cat apple pear , keep only the fruits </question> " + C, "ood_task"),
    (
        "<question> list 3 fruits . sort them alphabetically . use uppercase </question> " + C,
        "ood_task",
    ),
    (
        Q + " <rubric> <criterion> every word is in uppercase </criterion> </rubric>",
        "unknown_criterion",
    ),
    (Q + " <rubric> <criterion> the list is nice </criterion> </rubric>", "unknown_criterion"),
]


@pytest.mark.parametrize("text,reason", MALFORMED)
def test_malformed_answers_give_r_fmt_zero_with_their_reason(text, reason):
    g = parse_generated(text)
    assert g.task is None and g.reason == reason and reason in REASONS
    out = gate_outcome(g, True)
    assert r_fmt(out) == 0.0 and out.fmt_reason == reason and out.num_criteria == 0


def test_every_reason_is_reachable():
    assert {r for _, r in MALFORMED} | {"heldout_task", "no_final_answer"} == set(REASONS)


def test_heldout_tasks_are_refused_when_forbidden():
    held = ConstraintDomain(0).tasks("heldout", 20)
    forbidden = forbidden_signatures(held)
    for t in held:
        crit = library_criteria(t)[0].text
        text = format_generated(t.prompt[-1].content, [crit])
        assert parse_generated(text).reason is None
        assert parse_generated(text, forbidden=forbidden).reason == "heldout_task"


def test_fuzzed_answers_never_raise():
    vocab = generator_vocabulary()
    rng = np.random.default_rng(0)
    heads = ["<question>", "</question>", "<rubric>", "</rubric>", "<criterion>", "</criterion>"]
    for _ in range(400):
        words = [vocab[i] for i in rng.integers(len(vocab), size=int(rng.integers(0, 30)))]
        for h in heads:
            if rng.random() < 0.6:
                words.insert(int(rng.integers(len(words) + 1)), h)
        g = parse_generated(" ".join(words))
        assert (g.task is None) == (g.reason is not None)
        assert g.reason is None or g.reason in REASONS


def test_unknown_criteria_are_dropped_and_counted():
    text = format_generated(
        "list 3 fruits . use uppercase",
        [
            "the response lists exactly 3 items",
            "every word is in lowercase",  # a check, but not one this question states
            "the list is nice",  # no check at all
            "the response lists exactly 3 items",  # a duplicate
            "no item is repeated",  # an implicit requirement: a real check of the task
        ],
    )
    g = parse_generated(text, complete=False)
    assert g.reason is None and g.num_listed == 5
    assert [c.id for c in g.task.rubric.criteria] == ["count", "distinct"]
    assert g.num_unknown == 2 and g.num_duplicates == 1
    assert g.unknown == ("every word is in lowercase", "the list is nice")
    assert r_fmt(gate_outcome(g, False)) == 1.0 and gate_outcome(g, False).num_criteria == 2


# --- the tool and the agent loop --------------------------------------------------------------


def test_lookup_answers_from_the_lexicon():
    env = GeneratorEnv()
    env.reset(generator_task("list"))
    res = env.step(render_tool_call("lookup", {"category": "fruit"}))
    (rec,) = res.info["tool_calls"]
    assert rec["ok"] and rec["output"] == lookup_text("fruit")
    listed = rec["output"].split(" : ")[1].split(" , ")
    assert listed == list(CATEGORIES["fruit"]["common"] + CATEGORIES["fruit"]["rare"])
    res = env.step(render_tool_call("lookup", {"category": "dragon"}))
    (rec,) = res.info["tool_calls"]
    assert not rec["ok"] and rec["error_kind"] == "bad_arguments"


def test_word_tokenizer_calls_are_normalised(tok):
    call = render_tool_call("lookup", {"category": "city"})
    spaced = tok.decode(tok.encode(call))
    assert spaced != call and '" name "' in spaced
    env = GeneratorEnv()
    env.reset(generator_task("list"))
    (rec,) = env.step(spaced).info["tool_calls"]
    assert rec["ok"] and rec["arguments"] == {"category": "city"}
    assert normalise_tool_calls(call) == call and normalise_tool_calls('a " b "') == 'a " b "'


def _episode(tok, turns):
    engine = TurnScriptEngine(tok, [turns])
    env = GeneratorEnv()
    task = generator_task("list", ["list 2 cats"])
    sp = SamplingParams(max_new_tokens=128)
    chat = ChatFormat(tok, tools_in_system=False)
    (tr,) = run_agent(engine, chat, [env], [task], sp, AgentConfig(max_turns=4))
    return tr, task


FINAL = format_generated("list 3 fruits . use uppercase", ["the response lists exactly 3 items"])


def test_episode_with_a_lookup_is_tool_grounded(tok):
    call = render_tool_call("lookup", {"category": "fruit"})
    tr, _ = _episode(tok, [call, FINAL])
    g, out = episode_outcome(tr.response)
    assert tr.num_tool_calls == 1 and tr.num_tool_errors == 0
    assert g.reason is None and out.tool_observed and r_tool(out) == 1.0 and r_fmt(out) == 1.0
    assert g.task.prompt[-1].content == "list 3 fruits . use uppercase"


def test_episode_without_the_right_lookup_is_not_grounded(tok):
    tr, _ = _episode(tok, [FINAL])
    g, out = episode_outcome(tr.response)
    assert r_fmt(out) == 1.0 and not out.tool_observed and r_tool(out) == 0.0
    # a lookup of another category than the question's does not ground it
    tr, _ = _episode(tok, [render_tool_call("lookup", {"category": "animal"}), FINAL])
    assert not episode_outcome(tr.response)[1].tool_observed
    # a rejected call is no observation
    tr, _ = _episode(tok, [render_tool_call("lookup", {"category": "dragon"}), FINAL])
    assert tr.num_tool_errors == 1 and not episode_outcome(tr.response)[1].tool_observed
    # a question naming no category: any lookup grounds it
    final = format_generated(
        "rewrite : cat dog in reverse order", ["the response is the words : dog cat"]
    )
    tr, _ = _episode(tok, [render_tool_call("lookup", {"category": "animal"}), final])
    assert episode_outcome(tr.response)[1].tool_observed
    # turns used up by tool calls: no final answer
    call = render_tool_call("lookup", {"category": "fruit"})
    tr, _ = _episode(tok, [call] * 4)
    g, out = episode_outcome(tr.response)
    assert g.reason == "no_final_answer" and r_fmt(out) == 0.0


def test_demonstration_tokens_are_the_agent_loops(tok, train_tasks):
    """The second demonstration pair's prompt is token for token the rollout's context."""
    source = next(t for t in train_tasks if t.task_type == "list")
    rng = np.random.default_rng(3)
    pairs = generator_demonstration(source, rng, recent=["list 2 cats"])
    (call, final), _ = demonstration_turns(source, np.random.default_rng(3))
    tr, _ = _episode(tok, [call, final])
    second_prompt = tok.apply_chat_template(pairs[1][0], add_generation_prompt=True)
    first_prompt = tok.apply_chat_template(pairs[0][0], add_generation_prompt=True)
    ids = list(tr.token_ids)
    assert ids[: len(first_prompt)] == first_prompt
    assert ids[: len(second_prompt)] == second_prompt
    assert ids[len(second_prompt) :] == tok.encode(final) + [tok.eos_id]
    assert episode_outcome(tr.response)[0].reason is None


# --- the role prompt and the vocabulary ----------------------------------------------------


def test_role_prompt_keeps_the_ten_most_recent_negatives():
    recent = [f"list {i % 8 + 1} fruits" for i in range(14)]
    system, user = role_prompt("list", recent)
    assert system.role == "system" and user.role == "user"
    shown = [q.strip() for q in system.content.split("<question>")[2:]]
    assert [q.split(" </question>")[0] for q in shown] == recent[-10:]
    assert "avoid" not in role_prompt("list", recent, n_negatives=0)[0].content
    with pytest.raises(ValueError, match="task_type"):
        role_prompt("filter")


def test_generator_vocabulary_extends_the_domains_without_moving_ids():
    base = domain_vocabulary()
    vocab = generator_vocabulary()
    assert vocab[: len(base)] == base and tuple(vocab[len(base) :]) == GENERATOR_UNITS
    assert len(vocab) == len(set(vocab))
    # 6 special tokens: the embedded model's 64-multiple vocabulary is unchanged (576 rows)
    assert -(-(len(base) + 6) // 64) == -(-(len(vocab) + 6) // 64)


def _strip_specials(text):
    for s in SPECIALS:
        text = text.replace(s, " ")
    return text


def test_every_word_the_generator_reads_or_writes_is_in_the_vocabulary(tok):
    vocab = set(generator_vocabulary())
    corpus = generator_corpus(60, 1)
    texts = [m["content"] for msgs, _ in corpus for m in msgs] + [c for _, c in corpus]
    texts += [lookup_text(c) for c in CATEGORIES]
    for t in GENERATOR_TASK_TYPES:
        texts += [m.content for m in role_prompt(t, ["list 3 fruits"] * 12)]
    for text in texts:
        missing = {u for u in units(_strip_specials(text)) if u not in vocab}
        assert not missing, (missing, text)
        assert tok.hf.unk_token_id not in tok.encode(text)


# --- the corpus (opt-in) ----------------------------------------------------------------------


def test_generator_corpus_shape_and_negatives():
    corpus = generator_corpus(20, 0)
    assert len(corpus) == 40
    for (m1, c1), (m2, c2) in zip(corpus[::2], corpus[1::2], strict=True):
        assert c1.startswith("<tool_call>") and m2[: len(m1)] == m1
        assert m2[-2]["content"] == f"{c1} {EMBEDDED_TURN_END}" and m2[-1]["role"] == "tool"
        assert parse_generated(c2).reason is None
    # the instruction names the tag once; every other <question> is a negative
    negatives = [m1[0]["content"].count("<question>") - 1 for m1, _ in corpus[::2]]
    assert max(negatives) <= 10 and len(set(negatives)) > 3
    assert generator_corpus(20, 0) == corpus and generator_corpus(20, 1) != corpus


def test_corpus_opt_in():
    from rubric_rl.config.builders import Domain

    base = [([{"role": "user", "content": f"list {i} fruits"}], "apple .") for i in range(10)]
    extended = add_generator_demonstrations(base, 3, 0)
    assert len(extended) == 16 and [p for p in extended if p in base] == base
    domain = Domain(
        name="constraints",
        train=(),
        heldout=(),
        ood=(),
        corpus=lambda n, seed, p_keep, cf: base[:n],
        vocabulary=domain_vocabulary(),
    )
    wrapped = with_generator_demonstrations(domain, fraction=0.4)
    assert domain.corpus(10, 0, 0.4, 0.0) == base  # the original is untouched
    rows = wrapped.corpus(10, 0, 0.4, 0.0)
    assert len(rows) == 10 and sum(r in base for r in rows) == 6
    assert wrapped.vocabulary == generator_vocabulary()
    assert dataclasses.replace(wrapped, corpus=None, vocabulary=None) == dataclasses.replace(
        domain, corpus=None, vocabulary=None
    )


def test_reference_turns_replayed_through_the_env_are_grounded_and_parse():
    for task in GeneratorEnv.task_bank("train", 8):
        env = GeneratorEnv()
        env.reset(task)
        turns = GeneratorEnv.reference_turns(task)
        for turn in turns:
            res = env.step(turn)
        assert res.done and res.info["status"] == "answered" and len(turns) == 2
        g, out = episode_outcome(env.response())
        assert g.reason is None and out.tool_observed and g.task.task_type == task.task_type
