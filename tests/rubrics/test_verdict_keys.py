"""The verdict cache's content keys (rubric_rl/services/grader.py): what the judge sees decides the
key, the criterion's id does not, and the batch path (digests computed once per task, response and
criterion) gives the same key as the one-verdict path."""

import dataclasses

from rubric_rl.rubrics.types import Criterion, Message, Rubric, Task, Verifier, VerifierKind
from rubric_rl.services.grader import (
    criterion_digest,
    criterion_key,
    response_digest,
    task_digest,
    verdict_key,
)

CRIT = Criterion(
    id="c1", text="Names the capital.", title="capital",
    verifier=Verifier(VerifierKind.RULE, "include", (("word", "Paris"),)),
)  # fmt: skip
TASK = Task(
    id="t1", prompt=(Message("user", "Capital of France?"),), rubric=Rubric((CRIT,)),
    reference_answer="Paris",
)  # fmt: skip
RESPONSE = "It is Paris."


def test_batch_parts_give_the_one_verdict_key():
    key = criterion_key(TASK, RESPONSE, CRIT)
    item = response_digest(task_digest(TASK), RESPONSE)
    assert verdict_key(item, criterion_digest(CRIT)) == key


def test_every_part_the_judge_sees_changes_the_key_and_the_id_does_not():
    key = criterion_key(TASK, RESPONSE, CRIT)
    assert criterion_key(TASK, RESPONSE, dataclasses.replace(CRIT, id="other")) == key
    assert criterion_key(TASK, RESPONSE, dataclasses.replace(CRIT, created_step=7)) == key
    verifier = Verifier(VerifierKind.RULE, "include", (("word", "Lyon"),))
    system = (Message("system", TASK.prompt[0].content),)
    changed = [
        (TASK, "It is Lyon.", CRIT),
        (TASK, RESPONSE + "\udc80", CRIT),  # a lone surrogate is still a distinct response
        (dataclasses.replace(TASK, id="t2"), RESPONSE, CRIT),
        (dataclasses.replace(TASK, prompt=(Message("user", "Capital of Spain?"),)), RESPONSE, CRIT),
        (dataclasses.replace(TASK, prompt=system), RESPONSE, CRIT),
        (dataclasses.replace(TASK, reference_answer=None), RESPONSE, CRIT),
        (TASK, RESPONSE, dataclasses.replace(CRIT, text="Names the city.")),
        (TASK, RESPONSE, dataclasses.replace(CRIT, title="city")),
        (TASK, RESPONSE, dataclasses.replace(CRIT, weight=-1.0)),
        (TASK, RESPONSE, dataclasses.replace(CRIT, choices=("a", "b", "c"))),
        (TASK, RESPONSE, dataclasses.replace(CRIT, verifier=verifier)),
        (TASK, RESPONSE, dataclasses.replace(CRIT, verifier=Verifier())),
    ]  # fmt: skip
    keys = [criterion_key(*args) for args in changed]
    assert key not in keys and len(set(keys)) == len(keys)
    # A positive weight's size is not what the judge sees: only its sign.
    assert criterion_key(TASK, RESPONSE, dataclasses.replace(CRIT, weight=3.0)) == key
    # The boundary between the response and the criterion cannot shift: the parts are digests.
    assert criterion_key(TASK, "ab", CRIT) != criterion_key(TASK, "a", CRIT)
