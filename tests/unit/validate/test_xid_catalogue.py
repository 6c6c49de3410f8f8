"""The Xid -> action catalogue data file and its loader."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from gpuforge.errors import InputError
from gpuforge.validate import xid_catalogue
from gpuforge.validate.xid_catalogue import Action, Severity

REPO = Path(__file__).resolve().parents[3]

#: The codes issue 16 requires the catalogue to cover.
REQUIRED = [13, 31, 43, 45, 48, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95, 109, 119, 120, 140]
REQUIRED += list(range(143, 156))


def test_every_required_code_is_catalogued_with_a_source() -> None:
    cat = xid_catalogue.load()
    assert set(REQUIRED) <= set(cat.entries)
    for entry in cat.entries.values():
        assert entry.sources, entry.code
        assert all(s.url.startswith("https://") for s in entry.sources)
        # NVIDIA's catalog is cited for every code; its immediate bucket is recorded
        assert "nvidia" in {s.key for s in entry.sources}, entry.code
        assert entry.nvidia_immediate, entry.code
        assert entry.severity is xid_catalogue.SEVERITY_OF[entry.action]


def test_vocabulary_and_key_decisions() -> None:
    assert [a.value for a in Action] == ["none", "monitor", "reset_gpu", "reboot", "inspect", "rma"]
    assert [a for a in Action if a.drains] == [
        Action.RESET_GPU,
        Action.REBOOT,
        Action.INSPECT,
        Action.RMA,
    ]
    get = xid_catalogue.lookup
    assert get(79).action is Action.REBOOT  # NVIDIA: RESTART_BM
    assert get(48).action is Action.RESET_GPU
    assert get(95).action is Action.RESET_GPU
    assert get(45).action is Action.NONE
    for code in (13, 31, 43):  # application faults per NVIDIA: never a drain alone
        assert get(code).user_caused and not get(code).action.drains
        assert get(code).severity is Severity.WARNING
    assert not get(61).documented  # "Unused" in NVIDIA's current catalog: marked, not invented
    unknown = get(4242)
    assert (unknown.code, unknown.action, unknown.sources) == (4242, Action.MONITOR, ())


def test_packaged_file_sits_in_the_package() -> None:
    # hatchling's wheel target packages src/gpuforge whole, data files included
    assert xid_catalogue.CATALOGUE_PATH.is_file()
    assert xid_catalogue.CATALOGUE_PATH.parent.parent == Path(xid_catalogue.__file__).parent


def _write(tmp_path: Path, mutate: object) -> Path:
    data = yaml.safe_load(xid_catalogue.CATALOGUE_PATH.read_text(encoding="utf-8"))
    assert callable(mutate)
    mutate(data)
    path = tmp_path / "xid.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def _entry(data: dict[str, list[dict[str, object]]], code: int) -> dict[str, object]:
    return next(e for e in data["xids"] if e["code"] == code)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            lambda d: _entry(d, 79).update(action="drain"),
            "xids[79].action: unknown action 'drain' (one of none, monitor, reset_gpu",
        ),
        (
            lambda d: _entry(d, 48).update(severity="info"),
            "xids[48].severity: 'info' does not fit action 'reset_gpu'",
        ),
        (lambda d: _entry(d, 13).update(source=[]), "xids[13].source: must list"),
        (lambda d: _entry(d, 13).update(source=["wiki"]), "xids[13].source: unknown source"),
        (lambda d: _entry(d, 31).update(user_caused="yes"), "xids[31].user_caused: must be"),
        (lambda d: _entry(d, 31).update(colour="red"), "xids[31].colour: unknown key"),
        (lambda d: d["xids"].append(dict(_entry(d, 63))), "xids[63].code: listed twice"),
        (lambda d: d["sources"]["nvidia"].update(url="http://x"), "sources.nvidia.url"),
        (lambda d: d.update(schema=2), "schema: must be 1"),
    ],
)
def test_loader_rejects_a_bad_file_naming_the_key(
    tmp_path: Path, mutate: object, message: str
) -> None:
    path = _write(tmp_path, mutate)
    with pytest.raises(InputError) as err:
        xid_catalogue.load(path)
    assert str(err.value).startswith(f"{path}: ")
    assert message in str(err.value)


def test_loader_rejects_broken_yaml_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "xid.yaml"
    path.write_text("schema: 1\nxids: [\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"xid\.yaml: line \d+: not valid YAML"):
        xid_catalogue.load(path)


def _xid_docs() -> ModuleType:
    spec = importlib.util.spec_from_file_location("xid_docs", REPO / "tools" / "xid_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_health_doc_table_is_in_step_and_check_sees_a_stale_one(tmp_path: Path) -> None:
    tool = _xid_docs()
    assert tool.main(["--check"]) == 0
    doc = tmp_path / "docs" / "health.md"
    doc.parent.mkdir()
    current = (REPO / "docs" / "health.md").read_text(encoding="utf-8")
    doc.write_text(current.replace("| 79 | GPU has fallen off the bus | `reboot`", "| 79 | x |"))
    assert tool.main(["--check", "--root", str(tmp_path)]) == 1
    assert tool.main(["--root", str(tmp_path)]) == 0
    assert doc.read_text(encoding="utf-8") == current
