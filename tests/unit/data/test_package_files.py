"""`pkg://PACKAGE/FILE` names a file inside an installed package, found without importing it,
and a reward module named like hindsight's own `rewards` package is told to rename its folder."""
from __future__ import annotations

import sys

import pytest

from hindsight.errors import ConfigError
from hindsight.models.gguf import package_file


def test_a_package_file_is_found_without_importing_the_package(tmp_path, monkeypatch):
    pkg = tmp_path / "weights_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise ImportError('needs a plugin hindsight does not have')\n")
    (pkg / "model.gguf").write_bytes(b"GGUF")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert package_file("pkg://weights_pkg/model.gguf") == str(pkg / "model.gguf")
    assert "weights_pkg" not in sys.modules
    assert package_file("/plain/path") == "/plain/path"
    with pytest.raises(ConfigError, match="model.base: pkg://weights_pkg/other.gguf: package 'weights_pkg' has no "
                                          "file 'other.gguf' \\(it has __init__.py, model.gguf\\)"):
        package_file("pkg://weights_pkg/other.gguf")
    with pytest.raises(ConfigError, match="rl.init: pkg://not_installed_pkg/x.gguf: no installed package"):
        package_file("pkg://not_installed_pkg/x.gguf", "rl.init")
