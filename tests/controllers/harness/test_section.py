"""config.harness is HarnessSection's defaults and is read back field by field."""

import dataclasses

import pytest

from configs import harness_rl
from rubric_rl.config.config_validation import validate_config
from rubric_rl.methods.harness_rl.builder import harness_config
from rubric_rl.methods.harness_rl.section import HarnessSection
from rubric_rl.methods.method import section_defaults


def test_section_defaults_are_the_dataclass_defaults():
    # One source of each default: the base section is HarnessSection's fields, and what the
    # controller receives is those values (a second default in the mapping would differ).
    c = harness_rl.get_config()
    assert c.harness.to_dict() == section_defaults(HarnessSection)
    h = HarnessSection.from_config(c)
    assert h == HarnessSection()
    got = harness_config(c)
    assert (got.recalibrate, got.measurement, got.paired_samples, got.band_floor) == (
        h.recalibrate,
        h.measurement,
        h.paired_samples,
        h.cold_start.band_floor,
    )
    assert (got.evolver, got.sec, got.attributor) == (h.evolver, h.sec, h.attributor)
    assert got.cold_start_tasks == h.cold_start.tasks == 256
    smoke = harness_config(harness_rl.get_config("smoke"))
    assert (smoke.cold_start_tasks, smoke.cold_start_groups) == (4, 2)


def _drop(path):
    def edit(section):
        *parents, last = path.split(".")
        for p in parents:
            section = section[p]
        section.pop(last)

    return edit


def _set(path, value):
    def edit(section):
        *parents, last = path.split(".")
        for p in parents:
            section = section[p]
        section[last] = value

    return edit


@pytest.mark.parametrize(
    "edit, match",
    [
        (_drop("recalibrate"), r"config\.harness: missing field\(s\) \['recalibrate'\]"),
        (_drop("cold_start.band_floor"), r"config\.harness\.cold_start: missing field\(s\) "),
        (_set("pairedsamples", 16), r"config\.harness: unknown field\(s\) \['pairedsamples'\]"),
        (_set("sec.alpha", 0.5), r"config\.harness\.sec: unknown field\(s\) \['alpha'\]"),
        (_set("paired_samples", "16"), r"config\.harness\.paired_samples must be of type int"),
        (_set("cold_start.tasks", 2.5), r"config\.harness\.cold_start\.tasks must be of type int"),
        (_set("levels", (1.0, "x")), r"config\.harness\.levels\[1\] must be of type float"),
        (_set("critic", "yes"), r"config\.harness\.critic must be of type bool"),
        (_set("llm", "none"), r"config\.harness\.llm must be a section"),
    ],
)
def test_section_field_errors_name_the_field(edit, match):
    section = section_defaults(HarnessSection)
    edit(section)
    with pytest.raises(ValueError, match=match):
        HarnessSection.from_config({"harness": section})


def test_an_int_is_a_float_and_a_list_a_tuple():
    section = section_defaults(HarnessSection)
    section.update(total_weight=100, interfaces=["rubric"], floor=-1)
    h = HarnessSection.from_config({"harness": section})
    assert h == dataclasses.replace(HarnessSection(), interfaces=("rubric",))
    assert isinstance(h.total_weight, float) and isinstance(h.interfaces, tuple)


def test_start_up_validation_names_an_unknown_field():
    c = harness_rl.get_config("smoke")
    c.unlock()
    c.harness.cold_start.task = 8
    with pytest.raises(
        ValueError, match=r"config\.harness\.cold_start: unknown field\(s\) \['task'\]"
    ):
        validate_config(c)


def test_the_controllers_config_has_no_default_of_its_own():
    """HarnessSection holds the one default of each field: HarnessConfig (built only from the
    section by builder.harness_config) declares none."""
    import dataclasses

    from rubric_rl.methods.harness_rl.controller import HarnessConfig

    own = [
        f.name
        for f in dataclasses.fields(HarnessConfig)
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
    ]
    assert own == []
