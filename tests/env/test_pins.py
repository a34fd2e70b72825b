"""Pin files and the live package set: parsing, normalisation, the freeze hash."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from aleph.env.pins import (
    diff_packages,
    freeze_sha256,
    installed_packages,
    normalise,
    parse_pins,
)
from aleph.env.seed import SEED_PACKAGES
from aleph.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]

LOCK = """\
# a hash-locked file as pip-compile / uv write it
--index-url https://example.invalid/simple
Huggingface_Hub==1.26.0 \\
    --hash=sha256:aaaa \\
    --hash=sha256:bbbb
torch==2.4.1+cu124 ; sys_platform == "linux" \\
    --hash=sha256:cccc
    # via -r top-level.in
ruamel.yaml==0.18.6  # trailing comment
"""


def test_lock_with_hashes_continuations_and_options(tmp_path):
    f = tmp_path / "image.txt"
    f.write_text(LOCK)
    assert parse_pins(f) == {
        "huggingface-hub": "1.26.0",
        "torch": "2.4.1+cu124",
        "ruamel-yaml": "0.18.6",
    }


@pytest.mark.parametrize("bad", ["torch>=2.4", "just-a-name", "git+https://x.invalid/r.git"])
def test_unpinned_line_names_file_and_line(tmp_path, bad):
    f = tmp_path / "host.txt"
    f.write_text(f"numpy==1.26.3\n{bad}\n")
    with pytest.raises(ConfigError, match=r"host\.txt:2: expected 'name==version'"):
        parse_pins(f)


def test_name_pinned_twice_is_an_error(tmp_path):
    f = tmp_path / "pins.txt"
    f.write_text("PyYAML==6.0.2\npyyaml==6.0.1\n")
    with pytest.raises(ConfigError, match="pyyaml is pinned twice"):
        parse_pins(f)


def test_missing_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="pip_freeze.txt: pin file not found"):
        parse_pins(tmp_path / "pip_freeze.txt")


def test_normalise_is_pep503():
    assert normalise("Foo_Bar.baz--Qux") == "foo-bar-baz-qux"


def test_freeze_hash_is_over_sorted_normalised_lines():
    pkgs = {"torch": "2.4.1+cu124", "numpy": "1.26.3"}
    want = hashlib.sha256(b"numpy==1.26.3\ntorch==2.4.1+cu124\n").hexdigest()
    assert freeze_sha256(pkgs) == want
    assert freeze_sha256({**pkgs, "numpy": "1.26.4"}) != want


def _dist(site: Path, name: str, version: str) -> None:
    d = site / f"{name.replace('-', '_')}-{version}.dist-info"
    d.mkdir(parents=True)
    (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def test_installed_set_reads_metadata_and_ignores_the_project(tmp_path):
    _dist(tmp_path, "Typing_Extensions", "4.12.2")
    _dist(tmp_path, "aleph", "0.1.0")
    _dist(tmp_path, "pip", "24.0")
    assert installed_packages([str(tmp_path)]) == {"typing-extensions": "4.12.2", "pip": "24.0"}


def test_diff_ignores_installer_tools_unless_pinned():
    live = {"numpy": "1.26.3", "pip": "24.0", "setuptools": "65.5.0"}
    assert diff_packages(live, {"numpy": "1.26.3"}) == []
    assert diff_packages(live, {"numpy": "1.26.3", "pip": "24.2"}) == [("pip", "24.2", "24.0")]


def test_real_freeze_parses_and_carries_the_seed_pins():
    freeze = REPO / "pip_freeze.txt"
    if not freeze.exists():
        pytest.skip("pip_freeze.txt not written yet (lockfiles engineer)")
    pins = parse_pins(freeze)
    assert len(pins) == 179
    assert {n: pins.get(n) for n in SEED_PACKAGES} == SEED_PACKAGES


def test_the_image_locks_install_exactly_the_freeze():
    locks = [REPO / "lockfiles" / n for n in ("image.txt", "image-cu124.txt")]
    if not all(p.exists() for p in locks):
        pytest.skip("image locks not written yet (lockfiles engineer)")
    # Otherwise the image build fails later, at its `aleph env check --strict` step.
    installed = {**parse_pins(locks[0]), **parse_pins(locks[1])}
    assert installed == parse_pins(REPO / "pip_freeze.txt")


def test_unreadable_or_binary_pin_file_is_a_config_error(tmp_path):
    bad = tmp_path / "pip_freeze.txt"
    bad.write_bytes(b"\xff\xfetorch==2.4.1\n")
    with pytest.raises(ConfigError, match="pip_freeze.txt: not UTF-8"):
        parse_pins(bad)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "pip_freeze.txt").mkdir()  # a directory where the file should be
    with pytest.raises(ConfigError, match="pip_freeze.txt: cannot read the pin file"):
        parse_pins(tmp_path / "d" / "pip_freeze.txt")


def test_installed_set_reads_only_the_headers_and_agrees_with_the_email_parser(tmp_path):
    """The fast header read (no email parser over long descriptions) gives what
    importlib.metadata's full parse gives, on this interpreter's whole environment too."""
    from importlib import metadata

    d = tmp_path / "long_desc-1.0.dist-info"
    d.mkdir()
    (d / "METADATA").write_text("Metadata-Version: 2.1\nName: long-desc\nVersion: 1.0\n"
                                "Summary: x\n\nName: not-a-header\nVersion: 9.9\n")
    egg = tmp_path / "old_style-2.0.egg-info"
    egg.mkdir()
    (egg / "PKG-INFO").write_text("Metadata-Version: 1.0\nName: old-style\nVersion: 2.0\n")
    assert installed_packages([str(tmp_path)]) == {"long-desc": "1.0", "old-style": "2.0"}
    slow: dict[str, str] = {}
    for dist in metadata.distributions():
        if dist.metadata["Name"]:
            slow.setdefault(normalise(dist.metadata["Name"]), dist.version)
    from aleph.env.pins import SELF_NAMES

    assert installed_packages() == {n: v for n, v in slow.items() if n not in SELF_NAMES}
