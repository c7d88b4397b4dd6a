import pytest

from rubric_rl.util.registry import Registry


def test_register_get_and_unknown_name_lists_known():
    reg: Registry = Registry("widget")

    @reg.register("b")
    def b():
        return 2

    reg.register("a")(lambda: 1)
    assert reg.get("b") is b
    assert reg.names() == ["a", "b"]
    assert "a" in reg and "c" not in reg
    with pytest.raises(KeyError, match=r"unknown widget 'c'; known: a, b"):
        reg.get("c")


def test_reregistering_a_different_object_is_an_error():
    reg: Registry = Registry("widget")
    f = reg.register("x")(lambda: 1)
    reg.register("x")(f)  # same object: idempotent
    with pytest.raises(ValueError, match="already registered"):
        reg.register("x")(lambda: 2)
