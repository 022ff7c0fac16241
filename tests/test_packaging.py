"""pyproject.toml installs without setuptools' deprecation warnings."""

from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.version import Version

PYPROJECT = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())


def test_license_is_an_spdx_expression_the_required_setuptools_reads():
    # The table form ({text = ...}) is deprecated (a warning on every install) since setuptools 77,
    # the first release to read the SPDX string; `pip wheel .` then builds License-Expression.
    assert PYPROJECT["project"]["license"] == "Apache-2.0"
    [setuptools] = [Requirement(r) for r in PYPROJECT["build-system"]["requires"]]
    assert setuptools.name == "setuptools" and not setuptools.specifier.contains(Version("76.9"))
    assert setuptools.specifier.contains(Version("77.0.0"))
