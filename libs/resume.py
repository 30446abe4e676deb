"""Where a re-placed job resumes, told to a job that does not use the SDK
(pure). The driver finds the newest complete checkpoint in the job's
checkpoint directory (``libs.checkpoint_layouts``, whatever framework wrote
it) and gives each worker ``PRIMUS_RESUME_STEP``; and a job's ``command``
may name ``{checkpoint_dir}`` and ``{resume_step}``, replaced in each
argument (``--load {checkpoint_dir}``), so an unmodified job that honours its
framework's resume flag continues where it stopped. Nothing else in an
argument changes: other braces stay as written."""

from __future__ import annotations

RESUME_ENV = "PRIMUS_RESUME_STEP"
PLACEHOLDERS = ("{checkpoint_dir}", "{resume_step}")


def render(command: list[str], *, checkpoint_dir: str, resume_step: int | None) -> list[str]:
    """``command`` with the placeholders filled; no checkpoint resumes at 0."""
    step = str(resume_step or 0)
    return [arg.replace("{checkpoint_dir}", checkpoint_dir).replace("{resume_step}", step)
            for arg in command]


def uses(command: list[str], placeholder: str) -> bool:
    return any(placeholder in arg for arg in command)
