"""The generic registry shared by objectives, rewards, advantage estimators and engines."""

import pytest

from klear.registry import Registry


def test_register_get_and_list():
    registry = Registry("widget")

    @registry.register("b")
    def make_b():
        return "b"

    registry.register("a")(len)
    assert registry.names() == ["a", "b"]
    assert registry.get("b") is make_b and "a" in registry and "c" not in registry


def test_duplicate_name_raises_but_reregistering_the_same_object_is_idempotent():
    registry = Registry("widget")
    registry.register("x")(len)
    registry.register("x")(len)
    with pytest.raises(ValueError, match="widget 'x' is already registered by builtins:len"):
        registry.register("x")(abs)


def test_lookup_failure_lists_known_names():
    registry = Registry("widget")
    registry.register("alpha")(len)
    registry.register("beta")(abs)
    with pytest.raises(ValueError, match="unknown widget 'gamma'; registered: alpha, beta"):
        registry.get("gamma")


def test_lookup_failure_suggests_the_closest_name_by_edits_then_similarity():
    registry = Registry("objective")
    for name in ("cispo", "gppo", "gspo", "ppo"):
        registry.register(name)(type(name, (), {}))
    # A swap of neighbours is one edit: gppo, not gspo (which difflib alone rates as close, and sorts first).
    for typo, closest in (("gpop", "gppo"), ("GPPO", "gppo"), ("cipso", "cispo"), ("ppoo", "ppo")):
        with pytest.raises(ValueError, match=f"; did you mean '{closest}'\\?$"):
            registry.get(typo)
    with pytest.raises(ValueError) as error:
        registry.get("sft")
    assert "did you mean" not in str(error.value)


def test_import_path_works_in_place_of_a_name():
    registry = Registry("widget")
    assert registry.get("collections:OrderedDict").__name__ == "OrderedDict"
    assert registry.get("os.path:join").__name__ == "join"


def test_base_class_is_enforced_for_names_and_paths():
    registry = Registry("mapping", base=dict)
    with pytest.raises(TypeError, match="subclass of dict"):
        registry.register("l")(list)
    with pytest.raises(TypeError, match="subclass of dict"):
        registry.get("collections:deque")
    assert registry.get("collections:OrderedDict").__name__ == "OrderedDict"


@pytest.mark.parametrize("name", ["", "a:b"])
def test_invalid_names(name):
    with pytest.raises(ValueError, match="invalid widget name"):
        Registry("widget").register(name)


def test_non_string_lookup():
    with pytest.raises(TypeError, match="named by a string"):
        Registry("widget").get(3)
