"""The import paths of klear 0.1 that moved: still importable for one release, each with a DeprecationWarning."""

import importlib
import sys

import pytest

from klear import _moved


@pytest.mark.parametrize("old", sorted(_moved.MOVED_MODULES))
def test_an_old_module_path_warns_and_serves_the_new_modules(old, monkeypatch):
    monkeypatch.delitem(sys.modules, old, raising=False)
    with pytest.warns(DeprecationWarning, match=f"{old} moved to"):
        module = importlib.import_module(old)
    for new in _moved.MOVED_MODULES[old]:
        target = importlib.import_module(new)
        public = [name for name in vars(target) if not name.startswith("_")]
        assert public and all(getattr(module, name) is getattr(target, name) for name in public)
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        module.no_such_name  # noqa: B018


def test_old_names_of_the_stages_resolve_to_the_classes_of_today(monkeypatch):
    for old in ("klear.modules", "klear.modules.rl", "klear.modules.rl_loss"):
        monkeypatch.delitem(sys.modules, old, raising=False)
    from klear.stages.rl import RLModule
    from klear.stages.update import PolicyUpdate

    with pytest.warns(DeprecationWarning):
        from klear.modules.rl import RLModule as old
    assert old is RLModule
    with pytest.warns(DeprecationWarning):
        from klear.modules.rl_loss import positive_nll
    assert positive_nll is importlib.import_module("klear.stages.update").positive_nll
    assert PolicyUpdate.__module__ == "klear.stages.update"


@pytest.mark.parametrize(
    ("package", "name"),
    [(package, name) for package, names in sorted(_moved.MOVED_NAMES.items()) for name in sorted(names)],
)
def test_names_the_old_modules_exported_warn_and_resolve(package, name):
    module = importlib.import_module(package)
    with pytest.warns(DeprecationWarning, match=f"{package}.{name} moved to"):
        value = getattr(module, name)
    new, _, attribute = _moved.MOVED_NAMES[package][name].partition(":")
    target = importlib.import_module(new)
    for part in (attribute or name).split("."):
        target = getattr(target, part)
    assert value == target


def test_an_unknown_name_of_a_package_is_an_attribute_error():
    import klear.data

    with pytest.raises(AttributeError, match=r"module 'klear.data' has no attribute 'nope'"):
        klear.data.nope  # noqa: B018
