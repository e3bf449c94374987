"""
Loading of a manifest set: YAML files in, validated and cross-checked resources out, or one
ManifestError that lists every problem.

`lading run` applies a manifest set as a whole, so this module checks the set as a whole: each
document against its model (`lading.models.specs`), then the references between documents (a
batch's pool and delivery endpoint exist, the Secrets they name have the key, every batch's
namespace belongs to exactly one TenantQuota). What a quota allows (pools, priorities, room)
is not checked here but at admission (`lading.applying.check_batch`), once for every intake.
Nothing is half-applied because nothing is applied here at all: applying is the caller's job,
and it starts only once loading returned.

`lading apply` checks a set that may lean on objects applied before (`standalone=False`): a
reference to a pool, endpoint or Secret that is not in the files, or a batch namespace no quota in
the files covers, is then left to the database (admission says when it is missing there).

Every problem reads

    FILE: document N (Kind namespace/name): field.path: message

with the field path in the YAML's camelCase spelling (`spec.workers.maxReplicas`,
`spec.documents[3].key`) and N counting the `---`-separated documents of the file from 1.
All problems are collected before raising, so one run shows everything to fix.
Secret values never reach a message: errors of Secret documents do not echo inputs.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import pathlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Generic, TypeVar

import pydantic
import yaml

from lading import errors, storable
from lading.models import specs

R_co = TypeVar("R_co", bound=specs.Resource, covariant=True)

DEFAULT_NAMESPACE = "default"
MAX_PROBLEMS_SHOWN = 200
"""A broken 5000-document file must not make a megabyte-long exception message."""
_INPUT_ECHO_MAX = 60

_KNOWN: tuple[type[specs.Resource], ...] = (*specs.LADING_KINDS, specs.Secret)
_KINDS: dict[tuple[str, str], type[specs.Resource]] = {(cls.API_VERSION, cls.KIND): cls for cls in _KNOWN}
_LIST = ("v1", "List")


@dataclasses.dataclass(frozen=True)
class Loaded(Generic[R_co]):
    """A validated resource and where it was read, for messages that point back at the file."""

    resource: R_co
    source: str
    document: int
    """1-based position of the YAML document in its file, empty documents counted."""
    item: int | None = None
    """0-based index in `items` when the document is a `kind: List`."""

    @property
    def location(self) -> str:
        """'FILE: document N' (', items[I]' for a List item)."""
        return _location(self.source, self.document, self.item)

    @property
    def where(self) -> str:
        """'FILE: document N (Kind namespace/name)', the prefix of every message about this resource."""
        return f"{self.location} ({self.resource.KIND} {self.resource.display_name})"


@dataclasses.dataclass(frozen=True)
class Manifests:
    """A loaded, valid manifest set. Namespaced resources always have metadata.namespace set."""

    tenant_quotas: tuple[Loaded[specs.TenantQuota], ...] = ()
    inference_pools: tuple[Loaded[specs.InferencePool], ...] = ()
    delivery_endpoints: tuple[Loaded[specs.DeliveryEndpoint], ...] = ()
    extraction_batches: tuple[Loaded[specs.ExtractionBatch], ...] = ()
    secrets: tuple[Loaded[specs.Secret], ...] = ()

    def secret_value(self, *, namespace: str, ref: specs.SecretKeyRef) -> str:
        """The plain value of `ref` in `namespace`. Loading checked that it exists; KeyError if not."""
        for loaded in self.secrets:
            secret = loaded.resource
            if secret.namespace == namespace and secret.name == ref.name:
                values = secret.values
                if ref.key in values:
                    return values[ref.key]
                raise KeyError(f"Secret {namespace}/{ref.name} has no key {ref.key!r}")
        raise KeyError(f"no Secret {namespace}/{ref.name} in the manifests")


def load_paths(paths: Sequence[pathlib.Path], *, standalone: bool = True) -> Manifests:
    """Load YAML files (a directory means its *.yaml and *.yml files, sorted) as one manifest set.
    `standalone`: every reference must resolve within the files (False: or in the database)."""
    loader = _Loader(standalone=standalone)
    for path in _expand(paths, loader):
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            loader.problems.append(f"{path}: cannot read: {exc}")
            continue
        loader.add_text(text, source=str(path))
    return loader.finish()


def load_text(text: str, *, source: str) -> Manifests:
    """Load one YAML text as a manifest set; `source` names it in messages (a path, '<stdin>')."""
    loader = _Loader()
    loader.add_text(text, source=source)
    return loader.finish()


def _expand(paths: Sequence[pathlib.Path], loader: _Loader) -> Iterator[pathlib.Path]:
    for path in paths:
        if path.is_dir():
            found = sorted(p for p in path.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())
            if not found:
                loader.problems.append(f"{path}: directory holds no *.yaml or *.yml file")
            yield from found
        else:
            yield path


_Key = tuple[str, str | None, str]
"""(kind, namespace, name): what must be unique in a manifest set."""


class _Loader:
    """Accumulates documents and problems across files; `finish` cross-checks and decides."""

    def __init__(self, *, standalone: bool = True) -> None:
        self.standalone = standalone
        self.problems: list[str] = []
        self.loaded: list[Loaded[specs.Resource]] = []
        self.invalid: set[_Key] = set()
        """Objects present but invalid: references to them get no second, misleading error."""
        self.invalid_quota_namespaces: set[str] = set()

    def add_text(self, text: str, *, source: str) -> None:
        index = 0
        try:
            for index, data in enumerate(yaml.load_all(text, Loader=_UniqueKeySafeLoader), start=1):
                if data is not None:  # an empty document, e.g. after a trailing '---'
                    self._add_document(data, source=source, document=index, item=None)
        except yaml.YAMLError as exc:
            self.problems.append(_yaml_problem(exc, source=source, document=index + 1))
        except RecursionError:  # PyYAML's parser and constructor recurse once per level of nesting
            self.problems.append(f"{source}: document {index + 1}: invalid YAML: nested too deeply")

    def _add_document(self, data: object, *, source: str, document: int, item: int | None) -> None:
        location = _location(source, document, item)
        if not isinstance(data, dict):
            self.problems.append(
                f"{location}: expected a mapping with apiVersion and kind, got {_yaml_type(data)}"
            )
            return
        api_version, kind = data.get("apiVersion"), data.get("kind")
        if (api_version, kind) == _LIST:
            self._add_list(data, source=source, document=document, item=item)
            return
        cls = None
        if isinstance(api_version, str) and isinstance(kind, str):
            cls = _KINDS.get((api_version, kind))
        if cls is None:
            self.problems.append(f"{location}: {_unknown_kind(api_version, kind)}")
            return

        raw_key = _raw_key(cls, data)
        where = f"{location} ({cls.KIND} {_display(raw_key)})"
        try:
            resource = cls.model_validate(data, by_alias=True, by_name=False)
        except pydantic.ValidationError as exc:
            echo = cls is not specs.Secret
            self.problems.extend(f"{where}: {_describe(error, echo=echo)}" for error in exc.errors())
            self.invalid.add(raw_key)
            if cls is specs.TenantQuota:
                self.invalid_quota_namespaces.update(_raw_namespaces(data))
            return

        if not cls.NAMESPACED and resource.namespace is not None:
            self.problems.append(
                f"{where}: metadata.namespace: {cls.KIND} is cluster-scoped; remove metadata.namespace"
            )
            self.invalid.add(raw_key)
            return
        if cls.NAMESPACED and resource.namespace is None:
            metadata = resource.metadata.model_copy(update={"namespace": DEFAULT_NAMESPACE})
            resource = resource.model_copy(update={"metadata": metadata})
        self.loaded.append(Loaded(resource=resource, source=source, document=document, item=item))

    def _add_list(self, data: dict[Any, Any], *, source: str, document: int, item: int | None) -> None:
        location = _location(source, document, item)
        if item is not None:
            self.problems.append(f"{location}: a List inside a List is not supported")
            return
        items = data.get("items")
        if not isinstance(items, list):
            self.problems.append(f"{location} (List): items: must be a list of objects")
            return
        for index, entry in enumerate(items):
            self._add_document(entry, source=source, document=document, item=index)

    def finish(self) -> Manifests:
        self._check_duplicates()
        by_kind: dict[type[specs.Resource], list[Loaded[specs.Resource]]] = {}
        for loaded in self.loaded:
            by_kind.setdefault(type(loaded.resource), []).append(loaded)
        manifests = Manifests(
            tenant_quotas=_typed(by_kind, specs.TenantQuota),
            inference_pools=_typed(by_kind, specs.InferencePool),
            delivery_endpoints=_typed(by_kind, specs.DeliveryEndpoint),
            extraction_batches=_typed(by_kind, specs.ExtractionBatch),
            secrets=_typed(by_kind, specs.Secret),
        )
        _References(manifests, invalid=self.invalid, problems=self.problems, standalone=self.standalone).check(
            invalid_quota_namespaces=self.invalid_quota_namespaces,
        )
        if self.problems:
            raise errors.ManifestError(_summary(self.problems))
        return manifests

    def _check_duplicates(self) -> None:
        first: dict[_Key, Loaded[specs.Resource]] = {}
        unique: list[Loaded[specs.Resource]] = []
        for loaded in self.loaded:
            key = _key(loaded.resource)
            if key in first:
                self.problems.append(
                    f"{loaded.where}: metadata.name: duplicate {key[0]} {loaded.resource.display_name}, "
                    f"first defined at {first[key].location}"
                )
                continue
            first[key] = loaded
            unique.append(loaded)
        self.loaded = unique


class _References:
    """Cross-document checks over the valid resources. Appends to `problems`, never raises."""

    def __init__(self, manifests: Manifests, *, invalid: set[_Key], problems: list[str], standalone: bool) -> None:
        self.manifests = manifests
        self.standalone = standalone
        """False: a reference to an object that is not in the set is left to the database."""
        self.invalid = invalid
        self.problems = problems
        self.present: set[_Key] = {
            _key(loaded.resource)
            for group in (manifests.inference_pools, manifests.delivery_endpoints)
            for loaded in group
        }
        self.secrets: dict[tuple[str | None, str], specs.Secret] = {
            (loaded.resource.namespace, loaded.resource.name): loaded.resource for loaded in manifests.secrets
        }

    def check(self, *, invalid_quota_namespaces: set[str]) -> None:
        quotas = self._quota_by_namespace()
        for pool in self.manifests.inference_pools:
            spec = pool.resource.spec
            if spec.endpoint is not None and spec.endpoint.api_key_secret_ref is not None:
                self._secret(pool, "spec.endpoint.apiKeySecretRef", spec.endpoint.api_key_secret_ref)
            if spec.vllm is not None and spec.vllm.hf_token_secret_ref is not None:
                self._secret(pool, "spec.vllm.hfTokenSecretRef", spec.vllm.hf_token_secret_ref)
        for endpoint in self.manifests.delivery_endpoints:
            self._secret(endpoint, "spec.secretRef", endpoint.resource.spec.secret_ref)
        for batch in self.manifests.extraction_batches:
            self._batch(batch, quotas=quotas, invalid_quota_namespaces=invalid_quota_namespaces)

    def _quota_by_namespace(self) -> dict[str, Loaded[specs.TenantQuota]]:
        owners: dict[str, Loaded[specs.TenantQuota]] = {}
        for quota in self.manifests.tenant_quotas:
            for index, namespace in enumerate(quota.resource.spec.namespaces):
                if namespace in owners:
                    other = owners[namespace]
                    self.problems.append(
                        f"{quota.where}: spec.namespaces[{index}]: namespace {namespace} is already "
                        f"covered by TenantQuota {other.resource.name} ({other.location}); a namespace "
                        "belongs to one tenant"
                    )
                else:
                    owners[namespace] = quota
        return owners

    def _batch(
            self,
            batch: Loaded[specs.ExtractionBatch],
            *,
            quotas: Mapping[str, Loaded[specs.TenantQuota]],
            invalid_quota_namespaces: set[str],
    ) -> None:
        namespace = batch.resource.namespace or DEFAULT_NAMESPACE
        spec = batch.resource.spec
        pool_key = spec.pool_key(batch_namespace=namespace)
        pool_namespace, pool_name = pool_key.split("/", 1)
        self._exists(batch, "spec.inferencePoolRef", ("InferencePool", pool_namespace, pool_name))
        if spec.delivery_endpoint_ref is not None:
            key = ("DeliveryEndpoint", namespace, spec.delivery_endpoint_ref.name)
            self._exists(batch, "spec.deliveryEndpointRef", key)

        quota = quotas.get(namespace)
        if quota is None:
            if namespace not in invalid_quota_namespaces and self.standalone:
                self.problems.append(
                    f"{batch.where}: metadata.namespace: "
                    f"namespace {namespace} is not covered by any TenantQuota"
                )
            return

    def _exists(self, referrer: Loaded[specs.Resource], path: str, key: _Key) -> None:
        if key not in self.present and key not in self.invalid and self.standalone:
            kind, namespace, name = key
            self.problems.append(
                f"{referrer.where}: {path}: {kind} {namespace}/{name} is not in the manifests"
            )

    def _secret(self, referrer: Loaded[specs.Resource], path: str, ref: specs.SecretKeyRef) -> None:
        namespace = referrer.resource.namespace
        secret = self.secrets.get((namespace, ref.name))
        if secret is None:
            if ("Secret", namespace, ref.name) not in self.invalid and self.standalone:
                self.problems.append(
                    f"{referrer.where}: {path}: Secret {namespace}/{ref.name} is not in the manifests"
                )
            return
        keys = secret.keys()
        if ref.key not in keys:
            self.problems.append(
                f"{referrer.where}: {path}: Secret {namespace}/{ref.name} has no key {ref.key!r} "
                f"(keys: {', '.join(sorted(keys)) or 'none'})"
            )


class _UniqueKeySafeLoader(yaml.SafeLoader):
    """SafeLoader that rejects a key repeated in one mapping instead of keeping the last silently."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[object] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, str | int | float | bool) or key is None:
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping",
                        node.start_mark,
                        f"found duplicate key {key!r}",
                        key_node.start_mark,
                    )
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _typed(
        by_kind: Mapping[type[specs.Resource], list[Loaded[specs.Resource]]],
        cls: type[R_co],
) -> tuple[Loaded[R_co], ...]:
    found: list[Loaded[R_co]] = []
    for loaded in by_kind.get(cls, ()):
        resource = loaded.resource
        assert isinstance(resource, cls)
        found.append(
            Loaded(resource=resource, source=loaded.source, document=loaded.document, item=loaded.item)
        )
    return tuple(found)


def _key(resource: specs.Resource) -> _Key:
    return (resource.KIND, resource.namespace, resource.name)


def _raw_key(cls: type[specs.Resource], data: Mapping[Any, Any]) -> _Key:
    """The key as written, for naming a document that failed validation."""
    metadata = data.get("metadata")
    name = metadata.get("name") if isinstance(metadata, dict) else None
    namespace = metadata.get("namespace") if isinstance(metadata, dict) else None
    if cls.NAMESPACED and namespace is None:
        namespace = DEFAULT_NAMESPACE
    return (
        cls.KIND,
        namespace if isinstance(namespace, str) else None,
        name if isinstance(name, str) else "<no name>",
    )


def _raw_namespaces(data: Mapping[Any, Any]) -> set[str]:
    spec = data.get("spec")
    namespaces = spec.get("namespaces") if isinstance(spec, dict) else None
    if not isinstance(namespaces, list):
        return set()
    return {namespace for namespace in namespaces if isinstance(namespace, str)}


def _display(key: _Key) -> str:
    _, namespace, name = key
    return name if namespace is None else f"{namespace}/{name}"


def _location(source: str, document: int, item: int | None) -> str:
    suffix = "" if item is None else f", items[{item}]"
    return f"{source}: document {document}{suffix}"


def _yaml_type(data: object) -> str:
    return {list: "a list", str: "a string", int: "a number", float: "a number", bool: "a boolean"}.get(
        type(data), type(data).__name__
    )


def _unknown_kind(api_version: object, kind: object) -> str:
    known = ", ".join(f"{a} {k}" for a, k in (*_KINDS, _LIST))
    if api_version is None or kind is None:
        missing = " and ".join(n for n, v in (("apiVersion", api_version), ("kind", kind)) if v is None)
        return f"{missing} missing (known: {known})"
    return f"unknown apiVersion {api_version!s} with kind {kind!s}; this version of Lading reads {known}"


def _yaml_problem(exc: yaml.YAMLError, *, source: str, document: int) -> str:
    """'FILE: line L, column C: invalid YAML: problem (context at line L, column C)'."""
    if not isinstance(exc, yaml.MarkedYAMLError):
        return f"{source}: document {document}: invalid YAML: {exc}"
    position = f"document {document}" if exc.problem_mark is None else _mark(exc.problem_mark)
    detail = exc.problem or str(exc)
    if exc.context:
        started = "" if exc.context_mark is None else f" at {_mark(exc.context_mark)}"
        detail += f" ({exc.context}{started})"
    return f"{source}: {position}: invalid YAML: {detail}"


def _mark(mark: yaml.Mark) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}"


def _describe(error: Mapping[str, Any], *, echo: bool) -> str:
    """'field.path: message' from one pydantic error, in the YAML's spelling and in plain words."""
    path, is_key = _path(error["loc"])
    kind = error["type"]
    ctx = error.get("ctx") or {}
    if kind in ("value_error", "assertion_error") and "error" in ctx:
        message = str(ctx["error"])
    elif kind == "missing":
        message = "required field is missing"
    elif kind == "extra_forbidden":
        field = str(error["loc"][-1])
        close = difflib.get_close_matches(field, _known_fields(), n=1, cutoff=0.75)
        message = "unknown field" + (f" (did you mean {close[0]}?)" if close else "")
    elif kind == "string_pattern_mismatch" and ctx.get("pattern") in specs.PATTERN_HINTS:
        message = f"must be {specs.PATTERN_HINTS[ctx['pattern']]}"
    else:
        message = str(error["msg"])
    if is_key:
        message = f"key: {message}"
    value = error.get("input")
    quiet = ("missing", "extra_forbidden", "value_error", "assertion_error", "unstorable")  # ours name the value
    if echo and kind not in quiet and isinstance(value, str | int | float | bool):
        text = repr(value)
        message += f" (got {text[:_INPUT_ECHO_MAX]}{'…' if len(text) > _INPUT_ECHO_MAX else ''})"
    return f"{path}: {message}" if path else message


def _path(loc: Sequence[int | str]) -> tuple[str, bool]:
    """('spec', 'documents', 3, 'key') -> 'spec.documents[3].key'; True when the error is about a dict key."""
    out = ""
    is_key = False
    for part in loc:
        if part == "[key]":
            is_key = True
        elif isinstance(part, int):
            out += f"[{part}]"
        elif part.replace("_", "").replace("-", "").isalnum():
            out += f".{part}" if out else part
        else:
            out += f"[{part!r}]"
    return out, is_key


@functools.cache
def _known_fields() -> frozenset[str]:
    """Every camelCase field name of every model, for "did you mean" hints."""
    names: set[str] = set()
    pending: list[type[pydantic.BaseModel]] = [*_KINDS.values()]
    seen: set[type[pydantic.BaseModel]] = set()
    while pending:
        model = pending.pop()
        if model in seen:
            continue
        seen.add(model)
        for name, field in model.model_fields.items():
            names.add(field.alias or name)
            for arg in _type_args(field.annotation):
                if isinstance(arg, type) and issubclass(arg, pydantic.BaseModel):
                    pending.append(arg)
    return frozenset(names)


def _type_args(annotation: Any) -> Iterator[Any]:
    yield annotation
    for arg in getattr(annotation, "__args__", ()):
        yield from _type_args(arg)


def _summary(problems: Sequence[str]) -> str:
    count = len(problems)
    lines = [f"{count} problem{'s' if count != 1 else ''} in manifests:"]
    # Escaped: a name or kind as written may hold U+0000 or a lone surrogate, and a message that
    # cannot be encoded as UTF-8 would fail where it is printed or logged instead of being read.
    lines.extend(f"  {storable.escaped(problem)}" for problem in problems[:MAX_PROBLEMS_SHOWN])
    if count > MAX_PROBLEMS_SHOWN:
        lines.append(f"  … and {count - MAX_PROBLEMS_SHOWN} more")
    return "\n".join(lines)
