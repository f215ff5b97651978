"""Math answers in datasets: the ground truth read as is, after GSM8K's "####", or from MATH's last \\boxed{}."""

from __future__ import annotations

from posttrain.config.common import DatasetConfig
from posttrain.data.boxed import extract_last_boxed
from posttrain.data.sources import DataError, Row


def read_answer(row: Row, cfg: DatasetConfig) -> str:
    if cfg.answer_key not in row.data or row.data[cfg.answer_key] is None:
        raise DataError(
            f"{row.where}: missing key {cfg.answer_key!r} (the row has keys: {', '.join(row.data)})"
        )
    raw = str(row.data[cfg.answer_key])
    if cfg.answer_format == "gsm8k":
        if "####" not in raw:
            raise DataError(f"{row.where}: a GSM8K answer must end with '#### <answer>', got {raw[-60:]!r}")
        return raw.split("####")[-1].strip().replace(",", "")
    if cfg.answer_format == "boxed":
        boxed = extract_last_boxed(raw)
        if boxed is None:
            raise DataError(f"{row.where}: no \\boxed{{}} answer in {cfg.answer_key!r}")
        return boxed
    return raw.strip()
