"""How a run differs from the published E1 setup, and whether its figures compare with P.

Judged from the run's own files: config.json against the e1 preset, the target rows it
trained on (manifest.json), and with its eval.json the tasks (source, pair count) and the
tokenizer. A difference "moves the score" unless it only changes rounding or is a label
(preset); a run with any such difference is "not comparable to P" and `aleph report` never
draws it on the published scale. Operational fields (paths, cadences, sync) are not
differences: the data behind the paths is judged by its rows and content.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from aleph.data.bundle import TOKENIZER_PINS
from aleph.eval.tasks import E1_PAIRS, E1_TASKS, HF_TASKS
from aleph.record.launch import NUMERIC_CONFIG_FIELDS
from aleph.train.config import OPERATIONAL, PRESETS, TrainConfig

E1_ROWS = 31_905_616  # target rows of E1 (the seed), each trained on for 4 epochs
SHAPE = ("n_layers", "d_model", "n_heads", "ffn_dense", "ffn_expert", "n_anchors")
NOT_THE_SCORE = frozenset(NUMERIC_CONFIG_FIELDS) | {"preset"}  # rounding, or a label
NOT_COMPARABLE = "not comparable to P"


def e1_preset() -> dict[str, Any]:
    """The e1 preset's field values as config.json records them (tuples as lists); built
    from the field defaults, since a resolved e1 config needs captions and targets."""
    values = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    values.update(PRESETS["e1"])
    return {k: list(v) if isinstance(v, tuple) else v for k, v in values.items()}


def shape_text(cfg: dict) -> str:
    """'12x512' (layers x width) of a config."""
    return f"{cfg.get('n_layers', '?')}x{cfg.get('d_model', '?')}"


def _fmt(value) -> str:
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else repr(value)


def config_differences(config: dict) -> tuple[list[str], list[str]]:
    """(score-moving, rounding-only) differences of `config` from the e1 preset: model shape
    first, then 'field=value (e1: value)', then the fields it does not record at all."""
    ref = e1_preset()
    cfg = {k: v for k, v in config.items() if k != "format_version"}  # the file's, not a field
    moves, other = [], []
    absent = sorted(k for k in ref if k not in cfg and k not in OPERATIONAL and k not in ("arm", "seed"))
    if any(k not in cfg for k in SHAPE):
        moves.append(f"model shape not recorded (E1: {shape_text(ref)})")
    elif any(cfg[k] != ref[k] for k in SHAPE):
        moves.append(f"model {shape_text(cfg)}, {cfg['n_heads']} heads, ffn "
                     f"{cfg['ffn_dense']}/{cfg['ffn_expert']}x{cfg['n_anchors']} "
                     f"(E1: {shape_text(ref)}, {ref['n_heads']} heads, ffn {ref['ffn_dense']}/"
                     f"{ref['ffn_expert']}x{ref['n_anchors']})")
    for key in sorted(set(ref) | set(cfg)):
        if key in ("arm", "seed", *SHAPE, *absent) or key in OPERATIONAL or cfg.get(key) == ref.get(key):
            continue
        text = f"{key}={_fmt(cfg.get(key, 'absent'))} (e1: {_fmt(ref.get(key, 'absent'))})"
        (other if key in NOT_THE_SCORE else moves).append(text)
    if absent := [k for k in absent if k not in SHAPE]:
        moves.append(f"config fields not recorded: {', '.join(absent)}")
    return moves, other


def _trained_rows(manifest: dict | None) -> int | None:
    """Target rows the run trained on, from its launches' inputs or its top-level record."""
    if not isinstance(manifest, dict):
        return None
    for launch in reversed([e for e in manifest.get("launches") or [] if isinstance(e, dict)]):
        rec = (launch.get("inputs") or {}).get("target_store") if isinstance(launch.get("inputs"), dict) else None
        if isinstance(rec, dict) and isinstance(rec.get("rows"), int):
            return rec["rows"]
    for key in ("target_store", "targets"):
        rec = manifest.get(key)
        if isinstance(rec, dict) and isinstance(rec.get("rows"), int):
            return rec["rows"]
    return None


def task_problem(name: str, t: Any) -> str | None:
    """Why eval.json's task entry `t` is not the E1 task `name` (None when it is)."""
    if not isinstance(t, dict):
        return f"{name}: not recorded"
    if "e1_task" in t:
        return None if t["e1_task"] else f"{name}: {t.get('not_e1_task') or 'not the E1 task'}"
    # an eval.json from before tasks were checked: judge by source and pair count
    dataset, revision = HF_TASKS[name]
    pin = f"{dataset}@{revision[:12]}:test"
    source, pairs = str(t.get("source") or "?"), t.get("pairs")
    if pairs is None:
        return f"{name}: source and pair count not recorded"
    if pairs != E1_PAIRS[name]:
        return f"{name}: {source} has {_fmt(pairs)} pairs (E1: {E1_PAIRS[name]:,})"
    if source not in (f"hf:{pin}", f"bundle:{pin}"):
        return f"{name}: {source}, not checked against the pinned {pin}"
    return None


def task_differences(tasks: dict) -> list[str]:
    """How an eval.json's tasks differ from E1's 8 pinned test splits."""
    out = []
    missing = [n for n in E1_TASKS if n not in tasks]
    if missing or any(n not in E1_TASKS for n in tasks):
        out.append(f"task set {', '.join(tasks) or 'none'} (E1: the 8 STS tasks"
                   + (f"; missing {', '.join(missing)}" if missing else "") + ")")
    out += [p for n in E1_TASKS if n in tasks and (p := task_problem(n, tasks[n])) is not None]
    return out


def tokenizer_difference(config: dict, ev: dict | None) -> str | None:
    """How the run's tokenizer is not E1's pinned bert-base-uncased, else None."""
    name = config.get("tokenizer") or ""
    if config.get("smoke_data") or name not in TOKENIZER_PINS:
        shown = "the smoke data's own" if config.get("smoke_data") else repr(name)
        return f"tokenizer {shown} (E1: bert-base-uncased)"
    tok = (ev or {}).get("tokenizer")
    if isinstance(tok, dict) and tok.get("same_as_bundle") is False:
        return (f"tokenizer {name}: its files differ from the offline bundle's copy at "
                f"{str(TOKENIZER_PINS[name])[:12]}")
    return None


def judge(config: dict | None, ev: dict | None = None, manifest: dict | None = None) -> dict:
    """{comparable, moves (score-moving differences), other (rounding-only), short (the
    table's cell), text (the legend's words)} of one run against the published E1 setup."""
    if config is None:
        moves, other = ["no config.json: its setup is not recorded"], []
    else:
        moves, other = config_differences(config)
    rows = _trained_rows(manifest)
    if rows is not None and rows != E1_ROWS:
        moves.append(f"trained on {rows:,} target rows (E1: {E1_ROWS:,})")
    if ev is not None:
        moves += task_differences(ev.get("tasks") or {})
    if config is not None and (tok := tokenizer_difference(config, ev)) is not None:
        moves.append(tok)
    kinds = _kinds(config, moves)
    if moves:
        short = f"{NOT_COMPARABLE} ({', '.join(kinds)})"
        text = f"{NOT_COMPARABLE}: " + "; ".join(moves)
    else:
        short = "E1 setup" if not other else "comparable to P (rounding differs)"
        judged = ["model", "e1 preset config", *(["training rows"] if rows is not None else []),
                  *(["pinned tasks"] if ev is not None else []), "tokenizer"]
        text = f"E1's setup ({', '.join(judged)})"
    if other:
        text += "; differs only in rounding: " + ", ".join(other)
    if rows is None and config is not None:
        text += "; training rows not recorded"
    return {"comparable": not moves, "moves": moves, "other": other, "short": short, "text": text}


def _kinds(config: dict | None, moves: list[str]) -> list[str]:
    """Short names of what differs, for the table cell."""
    kinds = []
    for m in moves:
        kind = ("no config" if m.startswith("no config") else
                "model" if m.startswith("model shape not") else
                f"model {shape_text(config or {})}" if m.startswith("model ") else
                "rows" if m.startswith("trained on") else
                "tokenizer" if m.startswith("tokenizer") else
                "tasks" if m.split(":")[0] in E1_TASKS or m.startswith("task set") else "config")
        if kind not in kinds:
            kinds.append(kind)
    return kinds
