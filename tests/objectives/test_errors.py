"""Bad objective names and hyperparameters fail with messages that say what is accepted."""

import pytest

from klear.objectives import PolicyObjective, get_objective, objective_defaults, register_objective


def test_unknown_objective_lists_registered_names():
    names = "cispo, clip-cov, dapo, dapo-erc, dppo-kl, dppo-tv, gmpo, gppo, gppo-erc, gspo, kl-cov, ppo, sapo"
    with pytest.raises(ValueError, match=rf"unknown objective 'gpo'; registered: .*{names}"):
        get_objective("gpo")


def test_unknown_hyperparameter_is_named_with_the_accepted_ones():
    with pytest.raises(ValueError, match=r"objective 'gppo' has no hyperparameter 'eps_hgh'; accepted: eps_low"):
        get_objective("gppo", eps_hgh=0.3)
    # cispo has no dual clip: the option is rejected, not silently ignored.
    with pytest.raises(ValueError, match="'dual_clip'"):
        get_objective("cispo", dual_clip=3.0)


def test_duplicate_registration_is_an_error():
    with pytest.raises(ValueError, match=r"'ppo' is already registered by klear\.objectives\.ppo:PPOClip"):

        @register_objective("ppo")
        class AnotherPPO(PolicyObjective):
            pass


def test_registering_a_non_objective_is_an_error():
    with pytest.raises(TypeError, match="subclass of PolicyObjective"):
        register_objective("not-an-objective")(dict)


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("klear.nothing_here:X", "cannot import module 'klear.nothing_here'"),
        ("klear.objectives.ppo:Nope", "has no attribute 'Nope'"),
        ("klear.objectives.ppo:check_dual_clip", "subclass of PolicyObjective"),
        (":PPOClip", "must look like 'package.module:ClassName'"),
    ],
)
def test_bad_import_paths(path, message):
    with pytest.raises((ValueError, TypeError), match=message):
        get_objective(path)


@pytest.mark.parametrize(
    ("name", "hyperparameters", "message"),
    [
        ("ppo", {"eps_low": 1.2}, "eps_low must be in"),
        ("ppo", {"eps_high": -0.1}, "eps_high must be >= 0"),
        ("ppo", {"dual_clip": 0.5}, "dual_clip must be > 1"),
        ("gppo", {"beta_low": -1.0}, "beta_low and beta_high must be >= 0"),
        ("dapo", {"eps_low": None}, "needs a lower clip bound"),
    ],
)
def test_bad_hyperparameter_values(name, hyperparameters, message):
    with pytest.raises(ValueError, match=message):
        get_objective(name, **hyperparameters)


def test_defaults_are_read_from_the_constructor():
    assert objective_defaults("gppo") == {
        "eps_low": 0.2,
        "eps_high": 0.28,
        "beta_low": 1.0,
        "beta_high": 1.0,
        "dual_clip": None,
        "loss_agg": "token-mean",
    }
    assert objective_defaults("gspo")["loss_agg"] == "seq-mean-token-mean"
