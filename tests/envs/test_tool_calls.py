"""Tool-call parsing/validation, the Env step protocol, transcripts and shared answer checks."""

import json

import pytest

from rubric_rl.envs import base, trajectory
from rubric_rl.envs.base import Env
from rubric_rl.envs.tool_calls import (
    Param,
    ToolCall,
    ToolCallError,
    ToolSpec,
    has_tool_call,
    parse_tool_calls,
    render_tool_call,
    render_tool_response,
    tools_system_block,
    validate_call,
)
from rubric_rl.envs.trajectory import (
    Transcript,
    answer_matches,
    answer_segment,
    score_rules,
    transcript_of,
    value_matches,
)
from rubric_rl.rubrics.types import Criterion, Message, Rubric, Task, Verifier

ADD = ToolSpec(
    "add",
    "Add two integers.",
    (("a", Param("integer", "first")), ("b", Param("integer", "second", required=False))),
)
ECHO = ToolSpec("echo", "Echo text.", (("text", Param("string", "what to echo")),))
SPECS = {"add": ADD, "echo": ECHO}


def call(name, **arguments):
    return render_tool_call(name, arguments)


# ---------------------------------------------------------------------------------------------
# Parsing


def test_parse_zero_one_many_calls():
    assert parse_tool_calls("The answer is 4.") == []
    assert not has_tool_call("The answer is 4.")
    one = parse_tool_calls(
        'Let me check.\n<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>'
    )
    assert one == [ToolCall("add", {"a": 1}, raw=one[0].raw)]
    many = parse_tool_calls(
        call("echo", text="x") + "\n" + call("add", a=2, b=3) + call("echo", text="<b>")
    )
    assert [(c.name, dict(c.arguments)) for c in many] == [
        ("echo", {"text": "x"}),
        ("add", {"a": 2, "b": 3}),
        ("echo", {"text": "<b>"}),
    ]


def test_calls_inside_think_are_ignored():
    text = "<think>maybe " + call("add", a=1) + " no</think>Final: 3"
    assert parse_tool_calls(text) == [] and not has_tool_call(text)
    # An unclosed <think> hides everything after it.
    assert parse_tool_calls("<think>" + call("add", a=1)) == []
    # A call after the reasoning counts.
    assert [c.name for c in parse_tool_calls("<think>hm</think>" + call("add", a=1))] == ["add"]


@pytest.mark.parametrize(
    "body, kind",
    [
        ('{"name": "add", "arguments": {"a": 1}', "malformed_json"),
        ("[1, 2]", "malformed_json"),
        ('{"arguments": {"a": 1}}', "missing_name"),
        ('{"name": "  ", "arguments": {}}', "missing_name"),
        ('{"name": "add", "arguments": [1]}', "bad_arguments"),
        ('{"name": "echo", "arguments": {"text": "\\ud800"}}', "malformed_json"),
    ],
)
def test_malformed_blocks_become_errors(body, kind):
    (item,) = parse_tool_calls(f"<tool_call>{body}</tool_call>")
    assert isinstance(item, ToolCallError) and item.kind == kind
    assert item.observation().startswith(f"Error ({kind}): ")


def test_unclosed_and_stray_tags_keep_order():
    items = parse_tool_calls(call("echo", text="a") + ' </tool_call> <tool_call>{"name": "add"')
    assert isinstance(items[0], ToolCall)
    assert [getattr(i, "kind", None) for i in items[1:]] == ["stray_close_tag", "unclosed_tag"]
    assert has_tool_call("oops </tool_call>")


def test_arguments_given_as_json_string_are_accepted():
    (c,) = parse_tool_calls('<tool_call>{"name": "add", "arguments": "{\\"a\\": 5}"}</tool_call>')
    assert c.arguments == {"a": 5}


# ---------------------------------------------------------------------------------------------
# Validation and rendering


def test_validate_call_checks_tool_and_arguments():
    ok = validate_call(ToolCall("add", {"a": 2.0}), SPECS)
    assert ok.arguments == {"a": 2} and isinstance(ok.arguments["a"], int)
    cases = [
        (ToolCall("mul", {"a": 1}), "unknown_tool", "available tools: ['add', 'echo']"),
        (ToolCall("add", {}), "bad_arguments", "missing required argument 'a'"),
        (ToolCall("add", {"a": "1"}), "bad_arguments", "'a' must be of type integer"),
        (ToolCall("add", {"a": True}), "bad_arguments", "'a' must be of type integer"),
        (ToolCall("add", {"a": 1.5}), "bad_arguments", "'a' must be of type integer"),
        (ToolCall("add", {"a": 1, "c": 2}), "bad_arguments", "unexpected argument(s) ['c']"),
        (ToolCall("add", {"a": float("nan")}), "bad_arguments", "'a' must be a finite number"),
    ]
    for bad, kind, fragment in cases:
        with pytest.raises(ToolCallError) as e:
            validate_call(bad, SPECS)
        assert e.value.kind == kind and fragment in e.value.message, (bad, e.value.message)


def test_schema_and_rendering():
    assert ADD.schema() == {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {
                    "a": {"type": "integer", "description": "first"},
                    "b": {"type": "integer", "description": "second"},
                },
                "required": ["a"],
            },
        },
    }
    assert render_tool_response("42") == "<tool_response>\n42\n</tool_response>"
    assert render_tool_call("add", {"a": 1}) == (
        '<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>'
    )
    block = tools_system_block([ADD.schema()])
    assert "<tools>\n" + json.dumps(ADD.schema()) + "\n</tools>" in block
    assert "<tool_call></tool_call> XML tags" in block


# ---------------------------------------------------------------------------------------------
# The Env protocol, on a minimal environment


class CalcEnv(Env):
    name = "calc"
    TOOLS = (ADD, ECHO, ToolSpec("boom", "Always fails internally."))

    def _setup(self, task, seed):
        self.calls = 0

    def _tool_add(self, a, b=0):
        self.calls += 1
        return str(a + b)

    def _tool_echo(self, text):
        if not text:
            raise base.tool_error("nothing to echo", reason="empty")
        return base.ToolOutput(text, {"length": len(text)})

    def _tool_boom(self):
        raise RuntimeError("bug")

    def _state(self):
        return {"calls": self.calls}

    @classmethod
    def task_bank(cls, split="train", n=1, seed=0):
        return [TASK]

    @classmethod
    def reference_turns(cls, task):
        return [call("add", a=2, b=3), "Answer: 5"]


TASK = Task(
    id="calc-1",
    prompt=(Message("system", "Use the tools."), Message("user", "What is 2 + 3?")),
    rubric=Rubric(
        (
            trajectory.answer_criterion(
                (5,), ordered=True, weight=2.0, capability="arithmetic", text="Says 5."
            ),
            Criterion(
                "used_add",
                "Called add.",
                1.0,
                verifier=Verifier.rule("env_tool_used", tools=("add",)),
            ),
        )
        + trajectory.common_criteria()
    ),
    env_name="calc",
)


def run(turns, **cfg):
    env = CalcEnv(**cfg)
    env.reset(TASK)
    results = [env.step(t) for t in turns]
    return env, results


def verdicts(response):
    return {k: v.met for k, v in score_rules(TASK, response).items()}


def test_reset_observation_and_tools():
    env = CalcEnv()
    obs = env.reset(TASK)
    assert obs.messages == TASK.prompt
    assert list(obs.tools) == [ADD.schema(), ECHO.schema(), CalcEnv.TOOLS[2].schema()]
    msgs = obs.chat_messages(tools_in_system=True)
    assert msgs[0]["content"].startswith("Use the tools.\n\n# Tools")
    assert msgs[1] == {"role": "user", "content": "What is 2 + 3?"}
    with pytest.raises(ValueError, match="for env 'sql'"):
        env.reset(Task(id="x", prompt=TASK.prompt, rubric=TASK.rubric, env_name="sql"))


def test_scripted_episode_reward_and_transcript():
    env, (r1, r2) = run([call("add", a=2, b=3), "<think>easy</think>The sum is five.\nAnswer: 5"])
    assert r1.observation == "<tool_response>\n5\n</tool_response>" and not r1.done
    assert r1.tool_messages == (Message("tool", "5"),)
    assert r1.info["status"] == "tool_calls" and r1.info["num_errors"] == 0
    assert r2.observation is None and r2.done and r2.info["status"] == "answered"
    assert r2.info["final_answer"] == "The sum is five.\nAnswer: 5"
    tr = transcript_of(r2.info["response"], TASK)
    assert tr == env.transcript() and tr.state == {"calls": 1}
    assert [r.name for r in tr.tool_calls] == ["add"] and tr.tool_calls[0].turn == 1
    assert verdicts(r2.info["response"]) == {
        "answer_correct": True,
        "used_add": True,
        "answer_format": True,
        "malformed_tool_call": False,
        "tool_call_after_answer": False,
    }
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step("again")


def test_malformed_and_failing_calls_are_observations_not_crashes():
    turn = (
        '<tool_call>{"name": "add", "arguments": {"a": }</tool_call>'
        + call("nope")
        + call("add", a="x")
        + call("echo", text="")
        + call("boom")
        + call("add", a=1, b=1)
    )
    env, (r,) = run([turn])
    assert not r.done
    blocks = r.observation.split("\n</tool_response>\n<tool_response>\n")
    assert len(blocks) == 6 and len(r.tool_messages) == 6
    kinds = [c["error_kind"] for c in r.info["tool_calls"]]
    assert kinds == [
        "malformed_json",
        "unknown_tool",
        "bad_arguments",
        "tool_error",
        "tool_error",
        None,
    ]
    assert r.tool_messages[3].content == "Error (tool_error): nothing to echo"
    assert r.info["tool_calls"][3]["details"] == {"reason": "empty"}
    assert r.info["tool_calls"][4]["details"] == {"reason": "internal"}
    assert r.tool_messages[5].content == "2" and r.info["num_errors"] == 5
    env.step("Answer: 5")
    v = verdicts(env.response())
    assert v["malformed_tool_call"] is True and v["answer_correct"] is True


def test_tool_only_failures_are_not_malformed():
    env, _ = run([call("echo", text=""), call("add", a=5), "Answer: 5"])
    assert verdicts(env.response())["malformed_tool_call"] is False


def test_too_many_calls_per_turn_and_max_turns():
    env, (r,) = run(["".join(call("add", a=k) for k in range(4))], max_calls_per_turn=2)
    assert [c["ok"] for c in r.info["tool_calls"]] == [True, True, False, False]
    assert r.info["tool_calls"][2]["error_kind"] == "too_many_calls"
    env, rs = run([call("add", a=1)] * 2, max_turns=2)
    assert [x.done for x in rs] == [False, True] and rs[1].info["status"] == "max_turns"
    assert rs[1].observation == "<tool_response>\n1\n</tool_response>"
    v = verdicts(rs[1].info["response"])
    assert v["answer_correct"] is False and v["answer_format"] is False


def test_tool_call_after_answer_pitfall():
    env, _ = run(["Answer: 5\n" + call("add", a=2, b=3), "Answer: 5"])
    assert verdicts(env.response())["tool_call_after_answer"] is True
    env, _ = run([call("add", a=2, b=3) + "\nAnswer comes next.", "Answer: 5"])
    assert verdicts(env.response())["tool_call_after_answer"] is False


def test_output_cap():
    env, (r,) = run([call("echo", text="y" * 500)], max_output_chars=200)
    out = r.tool_messages[0].content
    assert len(out) < 200 and out.endswith("[output truncated: 360 more characters]")


def test_transcript_round_trip_and_plain_text_fallback():
    env, _ = run([call("echo", text='"quoted" </tool_call>'), "Answer: 5"])
    response = env.response()
    assert Transcript.from_response(response) == env.transcript()
    other = Task(id="calc-2", prompt=TASK.prompt, rubric=TASK.rubric, env_name="calc")
    with pytest.raises(ValueError, match="is for task 'calc-1'"):
        transcript_of(response, other)
    failed = score_rules(other, response)
    assert all(v.met is None and "calc-1" in v.error for v in failed.values())
    # A bare string is a final answer with an empty trajectory.
    plain = "<think>hmm</think>Answer: 5"
    assert verdicts(plain) == {
        "answer_correct": True,
        "used_add": False,
        "answer_format": True,
        "malformed_tool_call": False,
        "tool_call_after_answer": False,
    }


# ---------------------------------------------------------------------------------------------
# Final-answer matching


def test_answer_segment_takes_last_marker():
    assert answer_segment("Answer: 3\nwait.\n**Final Answer:** 4") == "4"
    assert answer_segment("just 7") == "just 7"
    assert answer_segment(None) is None


@pytest.mark.parametrize(
    "text, expected, ok",
    [
        ("$1,234.50", 1234.5, True),
        ("1234.504", 1234.5, True),
        ("1234.51", 1234.5, False),
        ("23.97 dollars", 23.97, True),
        ("2 mugs for 23.97", 23.97, False),
        ("42", 42, True),
        ("42.0", 42, True),
        ("0", 0, True),
        ("none", 0, False),
        ("'Ava  Chen'.", "ava chen", True),
        ("Ava Chen Jr", "Ava Chen", False),
    ],
)
def test_value_matches(text, expected, ok):
    assert value_matches(text, expected) is ok


def test_answer_matches_lists():
    exp = ("Ava Chen", "Ben Diaz", "Iris Ito")
    assert answer_matches("Answer: Ava Chen, Ben Diaz, Iris Ito", exp, ordered=True)
    assert answer_matches("Answer:\n1. Ava Chen\n2. Ben Diaz\n3. Iris Ito", exp, ordered=True)
    assert not answer_matches("Answer: Ben Diaz, Ava Chen, Iris Ito", exp, ordered=True)
    assert answer_matches("Answer: Ben Diaz, Ava Chen, Iris Ito", exp, ordered=False)
    assert not answer_matches("Answer: Ava Chen, Ben Diaz", exp, ordered=False)
    assert not answer_matches("Answer: Ava Chen, Ava Chen, Iris Ito", exp, ordered=False)
    assert not answer_matches(None, exp, ordered=True)
    assert answer_matches("The total is:\nAnswer: 7 units", (7,), ordered=True)
