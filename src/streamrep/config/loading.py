"""Reading a configuration file, applying the flags' overrides, and validating it.

The stream catalogue is handed in (``streams``): the configuration checks
``stream_writers`` against the streams the running program knows, and does not
itself know where stream definitions come from (see :mod:`streamrep.catalogue`).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Iterable, Mapping

import yaml

from streamrep.config.model import Config
from streamrep.config.ports import check_ports
from streamrep.config.problems import FLAG_OF_KEY, Problems
from streamrep.config.validation import StreamRules, validate
from streamrep.errors import ConfigError

if TYPE_CHECKING:
    from streamrep.streams.definition import StreamDefinition

__all__ = ["load_config"]


class _UniqueKeyLoader(yaml.SafeLoader):
    """A safe loader that refuses a key given twice in one mapping (PyYAML keeps the
    last silently, which hides typos in long files)."""


def _construct_unique_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode,
                              deep: bool = False) -> dict[Any, Any]:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None,
                f"key {key!r} appears twice (first on line {seen[key] + 1}); keep one",
                key_node.start_mark,
            )
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_unique_mapping
)


def _read_file(path: str, problems: Problems) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.load(fh, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except FileNotFoundError:
        problems.add("(file)", f"{path} does not exist", "give the path of an existing file")
        return None
    except (OSError, UnicodeDecodeError) as exc:
        problems.add("(file)", f"cannot read {path} ({exc})", "check the path and its permissions")
        return None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1} column {mark.column + 1}" if mark is not None else "?"
        what = " ".join(str(getattr(exc, "problem", None) or exc).split())
        problems.add("(file)", f"{path} is not valid YAML at {where}: {what}",
                     "fix the YAML syntax there")
        return None
    if data is None:
        return {}
    if not isinstance(data, dict):
        problems.add("(file)", f"{path} holds a {type(data).__name__}, not a mapping of keys",
                     "write it as `key: value` lines (see docs/examples/streamrep.yaml)")
        return None
    return data


def _set_dotted(data: dict[str, Any], key: str, value: object) -> None:
    parts = key.split(".")
    target = data
    for part in parts[:-1]:
        child = target.get(part)
        if not isinstance(child, dict):
            child = {}
            target[part] = child
        target = child
    target[parts[-1]] = value


def load_config(path: str | os.PathLike[str] | None,
                overrides: Mapping[str, object] | None = None,
                *, streams: Iterable[StreamDefinition],
                check_ports_of: str | None = None,
                flag_keys: Iterable[str] = ()) -> Config:
    """Read, override and validate a configuration; raise ConfigError on any problem.

    *path* is a YAML file (None: defaults and *overrides* alone). *overrides* maps
    dotted keys (``"listen"``, ``"logging.level"``, see :data:`~streamrep.config.problems.FLAG_KEYS`) to values
    from flags; ``None`` values are ignored, so optional flags can be passed as they
    are. *streams* are the stream definitions the program knows
    (:func:`streamrep.catalogue.known_streams`): ``stream_writers`` may name only
    them, and the loaded configuration names a writer for each. With
    *check_ports_of*, the ports that instance will listen on are checked too (see
    :func:`check_ports`). *flag_keys* are the keys the calling command also takes as
    flags, which a problem's fix may then suggest. Every problem is collected before
    raising.
    """
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    problems = Problems({k: FLAG_OF_KEY.get(k, "") for k in overrides}, flag_keys)
    source = os.fspath(path) if path is not None else None
    data: dict[str, Any] | None = {}
    if source is not None:
        data = _read_file(source, problems)
    config = None
    if data is not None:
        for key, value in overrides.items():
            _set_dotted(data, key, value)
        config = validate(data, StreamRules.of(streams), problems, source)
    if problems.lines or config is None:
        raise ConfigError("\n".join(problems.lines), tuple(problems.lines))
    if check_ports_of is not None:
        check_ports(config, check_ports_of)
    return config
