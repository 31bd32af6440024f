"""What every resource's serializer is: strict (StrictSerializer), with its request bodies in
the schema as it reads them (StrictSerializerSchema), and the model's own validation with
its errors keyed by field (`full_clean`)."""

from __future__ import annotations

from collections.abc import Mapping

from django.core.exceptions import NON_FIELD_ERRORS
from django.core.exceptions import ValidationError as DjangoValidationError
from drf_spectacular.extensions import OpenApiSerializerExtension
from rest_framework import serializers

from policies.services.errors import conflict


def full_clean(row, exclude: tuple[str, ...] = (), prefix: str = "") -> None:
    """The model's own validation; its errors keyed by field (`prefix` before each name).
    A clash with an existing row's unique name is a 409, not a 400."""
    try:
        row.full_clean(exclude=list(exclude))
    except DjangoValidationError as error:
        errors = error.error_dict if hasattr(error, "error_dict") else {NON_FIELD_ERRORS: error.error_list}
        for field, items in errors.items():
            taken = [item for item in items if item.code == "unique"]
            if taken and field != NON_FIELD_ERRORS:
                raise conflict(taken[0].messages[0], f"{prefix}{field}") from None
        raise serializers.ValidationError(
            {
                (prefix.rstrip(".") or "non_field_errors") if field == NON_FIELD_ERRORS else f"{prefix}{field}": [
                    message for item in items for message in item.messages
                ]
                for field, items in errors.items()
            }
        ) from None


class StrictSerializer(serializers.Serializer):
    """Refuses unknown fields; on PUT (`instance` given, not partial) needs every writable
    field but those `kept_on_put` (a secret, written and never read, stays as it is when a
    PUT leaves it out); handles `version`, the optimistic lock, when the model has one."""

    kept_on_put: tuple[str, ...] = ()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        StrictSerializerSchema.for_serializer(cls)  # its request bodies, as it reads them

    def to_internal_value(self, data):
        if isinstance(data, Mapping):
            known = [name for name, field in self.fields.items()]
            for name in data:
                if name not in self.fields:
                    raise serializers.ValidationError({name: f"unknown field (known: {', '.join(known)})"})
            self._check_version(data)
            if self.instance is not None and not self.partial:
                for name, field in self.fields.items():
                    if not field.read_only and name not in data and name not in self.kept_on_put:
                        raise serializers.ValidationError(
                            {
                                name: "this field is required: PUT replaces the whole resource (PATCH changes "
                                "only the fields it sends)"
                            }
                        )
        return super().to_internal_value(data)

    def _check_version(self, data: Mapping) -> None:
        if "version" not in self.fields:
            return
        if self.instance is None:
            if "version" in data:
                raise serializers.ValidationError(
                    {"version": "read-only: the server sets it; leave it out when creating"}
                )
            return
        if "version" not in data:
            raise serializers.ValidationError({"version": "this field is required: send the version you read"})
        sent = data["version"]
        if isinstance(sent, bool) or not isinstance(sent, int):
            raise serializers.ValidationError({"version": "must be a whole number: the version you read"})
        if sent != self.instance.version:
            raise conflict(
                f"{self.instance._meta.verbose_name} {self.instance} changed since you read it: it is at "
                f"version {self.instance.version}, you sent {sent}. Read it again and reapply your "
                f"change.",
                "version",
            )


class StrictSerializerSchema(OpenApiSerializerExtension):
    """A StrictSerializer's request bodies as it reads them: a create sends no `version`
    (its own component, `New<Name>Request`), a PUT sends every field and `version`, a PATCH
    sends `version` and the fields it changes. A serializer's `request_constraints(method)`
    adds what ties its fields together (an alert's window goes with its kind).

    Each StrictSerializer gets a subclass of its own that targets it (`for_serializer`), so
    that `map_serializer` starts from drf-spectacular's own mapping of it, as its extension
    API documents, and changes only the request bodies."""

    target_class = None  # set by each serializer's own subclass

    @classmethod
    def for_serializer(cls, serializer: type) -> None:
        type(f"{serializer.__name__}Schema", (cls,), {"target_class": serializer})

    def get_name(self, auto_schema, direction):
        if direction == "request" and auto_schema.method == "POST" and "version" in self.target.fields:
            return "New" + type(self.target).__name__.removesuffix("Serializer")
        return None

    def map_serializer(self, auto_schema, direction):
        schema = super().map_serializer(auto_schema, direction)
        if direction != "request":
            return schema
        properties = schema["properties"]
        if auto_schema.method == "POST":
            properties.pop("version", None)
            required = [name for name in schema.get("required", []) if name != "version"]
        elif auto_schema.method == "PUT":
            kept = self.target.kept_on_put
            required = [name for name, field in self.target.fields.items() if not field.read_only and name not in kept]
        else:
            required = ["version"] if "version" in properties else []
        schema.pop("required", None)
        if required:
            schema["required"] = required
        constraints = getattr(self.target, "request_constraints", None)
        if constraints is not None:
            schema.update(constraints(auto_schema.method))
        return schema
