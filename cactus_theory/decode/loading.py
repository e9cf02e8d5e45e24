"""Loading a causal LM and its tokenizer from a folder, a GGUF file or a hub id, offline-first.

``load_model(name, path_or_id)`` decides what the string is before anything slow happens:

- an existing folder: ``from_pretrained(folder)`` (a folder holding a single ``.gguf``
  file and no ``config.json`` loads that file);
- an existing ``.gguf`` file: ``from_pretrained(folder, gguf_file=name)`` (needs the
  ``gguf`` package; the weights are dequantised to the requested dtype);
- a missing path (anything that looks like one: ``/x``, ``./x``, ``~/x``, ``a/b/c``,
  ``x.gguf``): "path ... does not exist", at once;
- a hub id (``name`` or ``org/name``): the local Hugging Face cache first; then, unless
  ``HF_HUB_OFFLINE`` is set, the hub, after a 3-second reachability check, so that with no
  network the failure is one clear line within seconds instead of minutes of retries.

Every failure is a ValueError naming ``name`` (the argument: verifier or draft).
"""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path

#: org/name or name, as the hub spells ids.
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*(/[A-Za-z0-9][\w.\-]*)?$")
HUB_HOST = ("huggingface.co", 443)
REACH_TIMEOUT_S = 3.0


def looks_like_hub_id(value: str) -> bool:
    return bool(HUB_ID.match(value)) and not value.endswith(".gguf")


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _hub_reachable() -> bool:
    if any(os.environ.get(key) for key in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY")):
        return True  # a proxy decides; the hub client's own timeouts apply
    try:
        with socket.create_connection(HUB_HOST, timeout=REACH_TIMEOUT_S):
            return True
    except OSError:
        return False


def resolve(name: str, path_or_id: str) -> tuple[str, dict]:
    """(what to pass to ``from_pretrained``, extra keyword arguments), or ValueError."""
    if not isinstance(path_or_id, str) or not path_or_id.strip():
        raise ValueError(f"{name}: expected a folder, a .gguf file or a hub id, got {path_or_id!r}")
    path = Path(path_or_id).expanduser()
    if path.is_file():
        if path.suffix != ".gguf":
            raise ValueError(f"{name}: {path_or_id!r} is a file but not a .gguf model")
        return str(path.parent), {"gguf_file": path.name}
    if path.is_dir():
        ggufs = sorted(path.glob("*.gguf"))
        if not (path / "config.json").exists() and len(ggufs) == 1:
            return str(path), {"gguf_file": ggufs[0].name}
        return str(path), {}
    if not looks_like_hub_id(path_or_id):
        raise ValueError(f"{name}: path {path_or_id!r} does not exist")
    return path_or_id, {"hub": True}


def load_model(name: str, path_or_id: str, device="cpu", dtype: str = "float32"):
    """(model in eval mode on ``device``, tokenizer) for a folder, a .gguf file or a hub
    id (see the module docstring)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source, options = resolve(name, path_or_id)
    from_hub = options.pop("hub", False)
    torch_dtype = getattr(torch, dtype)

    def load(**extra):
        tokenizer = AutoTokenizer.from_pretrained(source, **options, **extra)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=torch_dtype, **options, **extra)
        return model, tokenizer

    try:
        if not from_hub:
            model, tokenizer = load()
        else:
            try:
                model, tokenizer = load(local_files_only=True)
            except (OSError, ValueError):
                if _offline():
                    raise ValueError(
                        f"{name}: {path_or_id!r} is not a local path and not in the Hugging "
                        "Face cache, and HF_HUB_OFFLINE is set"
                    ) from None
                if not _hub_reachable():
                    raise ValueError(
                        f"{name}: {path_or_id!r} is not a local path and not in the Hugging "
                        "Face cache, and the hub cannot be reached (no network?); pass a "
                        "local folder or .gguf file"
                    ) from None
                model, tokenizer = load()
    except ValueError as error:
        if str(error).startswith(f"{name}:"):
            raise
        raise ValueError(f"{name}: cannot load {path_or_id!r} ({error})") from None
    except (OSError, KeyError, ImportError) as error:
        raise ValueError(f"{name}: cannot load {path_or_id!r} ({error})") from None
    return model.to(device).eval(), tokenizer
