"""environment.yml (conda) and pyproject.toml (pip) must install the same pinned packages."""

import tomllib

import yaml

from tests.helpers import ROOT


def _pins(requirements):
    pins = {}
    for requirement in requirements:
        name, _, version = requirement.partition("==")
        assert version, f"{requirement!r} is not pinned with =="
        pins[name.strip().lower()] = version.strip()
    return pins


def test_conda_and_pip_pin_the_same_packages():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    conda_pins = _pins(r for r in pip_section if not r.startswith("-e"))
    assert "-e ." in pip_section, "environment.yml must install the course package itself"
    assert conda_pins == _pins(project["dependencies"])


def test_python_versions_agree():
    """conda installs the oldest Python that pyproject.toml allows: the two files, compared."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    conda_python = next(
        d for d in env["dependencies"] if isinstance(d, str) and d.startswith("python=")
    )
    minimum = project["requires-python"].removeprefix(">=")
    assert project["requires-python"] == f">={minimum}", "requires-python must read >=X.Y"
    assert conda_python == f"python={minimum}", (conda_python, project["requires-python"])
