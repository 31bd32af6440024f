"""The admin's form of a rule: a typed field per parameter, built from the rule type's own
declarations (`core.RULES[type].params`, `core.Param`: name, kind, bounds, help, default),
and raw JSON for the rest.

Every typed rule type's fields are on the page, each group with its help and bounds; a small
script (static/policies/rule_params.js) shows the group of the type picked, before anything
is saved. A field is named `<type>__<parameter>` (`token_bucket__capacity`). Plug-in rule
types (registered in core.RULES outside the engine), and any type with a parameter the form
cannot show as one input, keep their parameters as JSON in the `params` field ("advanced").

The form only builds the rule's spec from its fields; the policy's invariants
(`policies.invariants`) judge it, and their refusal goes on the field it names.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from django import forms
from django.core.exceptions import ValidationError

from core import RULES, Param
from core.params import LARGEST_NUMBER, format_number

from ..documents import MAX_DEPTH, BoundedJSONDecoder
from ..invariants import SPEC_FIELDS, PolicyViolation, check_rule
from ..models import Rule

# The parameter kinds a typed field can hold; a "strings" list is JSON ("advanced").
FIELD_KINDS = ("number", "integer", "string", "choice")


def is_typed(rule_type: Any) -> bool:
    """Whether the form shows `rule_type`'s parameters as typed fields: a rule type of the
    engine itself whose every parameter is one number or string."""
    cls = RULES.get(rule_type) if isinstance(rule_type, str) else None
    return (
        cls is not None
        and cls.__module__.split(".")[0] == "core"
        and all(param.kind in FIELD_KINDS for param in cls.params)
    )


def typed_types() -> list[str]:
    return [name for name in sorted(RULES) if is_typed(name)]


def field_name(rule_type: str, parameter: str) -> str:
    """The form field of one parameter of one rule type: `token_bucket__capacity`."""
    return f"{rule_type}__{parameter}"


def bounds(param: Param) -> str:
    """A parameter's kind and bounds as the form shows them: `number > 0, at most 86400,
    default 60`."""
    if param.kind != "choice":
        text = param.kind
    elif len(param.choices) <= 12:
        text = f"one of {', '.join(param.choices)}"
    else:
        text = f"one of {len(param.choices)} names"
    if param.minimum is not None:
        text += f" {'>' if param.exclusive_minimum else '≥'} {format_number(param.minimum)}"
    if param.kind in ("number", "integer") and param.maximum != LARGEST_NUMBER:
        text += f", at most {format_number(param.maximum)}"
    if param.required:
        return text + ", required"
    return text + (", optional" if param.default is None else f", default {format_number(param.default)}")


def typed_value(param: Param, raw: str) -> Any:
    """What a typed field's text stands for: a number where it reads as one (an int when it
    is whole, as a policy file would write it), else the text, for the engine to refuse."""
    if param.kind in ("string", "choice"):
        return raw
    for read in (int, float):
        try:
            return read(raw)
        except ValueError:
            continue
    return raw


class ParameterField(forms.CharField):
    """One declared parameter: its text, read by `typed_value`. Not checked here: the engine's
    declaration is (through `check_rule`), with the same words as for a policy file."""

    def __init__(self, param: Param) -> None:
        attrs: dict[str, Any] = {"class": "rule-param-input", "data-param": param.name}
        if not param.required and param.default is not None and param.kind != "choice":
            attrs["placeholder"] = format_number(param.default)
        made: forms.Widget
        if param.kind in ("number", "integer"):
            attrs["step"] = "1" if param.kind == "integer" else "any"
            if param.minimum is not None and not param.exclusive_minimum:
                attrs["min"] = format_number(param.minimum)
            if param.maximum != LARGEST_NUMBER:
                attrs["max"] = format_number(param.maximum)
            made = forms.NumberInput(attrs=attrs)
        elif param.kind == "choice":
            # The empty choice leaves the parameter out: its default, or required.
            empty = "(required)" if param.required else f"(default: {format_number(param.default)})"
            made = forms.Select(attrs=attrs, choices=[("", empty), *((choice, choice) for choice in param.choices)])
        else:
            made = forms.TextInput(attrs=attrs)
        super().__init__(required=False, label=param.name, help_text=param.help, widget=made)
        self.param = param


class ParametersWidget(forms.Widget):
    """The parameters cell of a rule: each typed rule type's fields (the form's own bound
    fields, with their errors), shown for the type picked, and the JSON of the others."""

    template_name = "admin/policies/rule_parameters.html"

    def __init__(self, form: RuleForm) -> None:
        super().__init__(attrs={"rows": 3, "cols": 30})
        self.form = form

    def value_from_datadict(self, data, files, name):
        # A typed rule's parameters are in its typed fields; its JSON box is not read.
        type_name = name[: -len("params")] + "type"
        return None if is_typed(data.get(type_name)) else data.get(name)

    def format_value(self, value):
        return "" if value in (None, "null") else value

    def get_context(self, name, value, attrs):
        context = super().get_context(name, value, attrs)
        chosen = self.form["type"].value()
        context["widget"]["groups"] = list(self.form.parameter_groups(chosen))
        context["widget"]["plugins"] = [
            {
                "type": name,
                "chosen": name == chosen,
                "params": [(p.name, bounds(p), p.help) for p in RULES[name].params],
            }
            for name in sorted(RULES)
            if not is_typed(name)
        ]
        context["widget"]["advanced"] = bool(chosen) and not is_typed(chosen)
        context["widget"]["chosen"] = chosen or ""
        return context


class RuleForm(forms.ModelForm):
    """A rule: its level, its type, the typed parameters of that type (or JSON), its label,
    whether it is a shadow rule, what it counts and its position."""

    params = forms.JSONField(
        required=False,
        label="Parameters",
        decoder=BoundedJSONDecoder,
        error_messages={"invalid": f"Enter a valid JSON, nested at most {MAX_DEPTH} levels deep."},
    )

    class Meta:
        model = Rule
        fields = ["level", "type", "params", "label", "shadow", "counts", "position"]

    class Media:
        js = ["policies/rule_params.js"]
        css = {"all": ["policies/rule_params.css"]}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for rule_type in typed_types():
            for param in RULES[rule_type].params:
                self.fields[field_name(rule_type, param.name)] = ParameterField(param)
        stored = self.instance.params if isinstance(self.instance.params, dict) else {}
        if is_typed(self.instance.type):
            for name, value in stored.items():
                # As text, as the page sends it back: an unchanged rule is no change. An
                # optional parameter stored as null is an empty field, as it would be sent.
                if value is not None:
                    self.initial.setdefault(field_name(self.instance.type, name), format_number(value))
            self.initial["params"] = None
        self.fields["params"].widget = ParametersWidget(self)
        self.fields["type"].widget.attrs["class"] = "rule-type-select"
        self.refused = False

    def parameter_groups(self, chosen: str | None) -> Iterator[dict]:
        """Each typed rule type's bound fields, with their bounds, for the parameters cell."""
        for rule_type in typed_types():
            fields = [
                {"field": self[field_name(rule_type, param.name)], "bounds": bounds(param), "help": param.help}
                for param in RULES[rule_type].params
            ]
            yield {"type": rule_type, "chosen": rule_type == chosen, "fields": fields}

    def clean(self):
        data = super().clean() or {}
        rule_type = data.get("type")
        if not rule_type:
            return data  # the type field's own error
        if is_typed(rule_type):
            given = {p.name: data.get(field_name(rule_type, p.name)) for p in RULES[rule_type].params}
            declared = {p.name: p for p in RULES[rule_type].params}
            data["params"] = {name: typed_value(declared[name], raw) for name, raw in given.items() if raw}
        elif "params" in self.errors:
            return data  # JSON that does not parse
        elif data.get("params") is None:
            data["params"] = {}
        if not isinstance(data["params"], dict):
            self.add_error("params", "Must be a mapping of parameter names to values.")
            self.refused = True
            return data
        spec = Rule(**{name: data.get(name) for name in ("type", "params", "label", "shadow", "counts")}).spec()
        try:
            check_rule(spec)
        except PolicyViolation as error:
            self.add_error(self.field_of(error, rule_type), self.words_of(error))
            self.refused = True
        return data

    def field_of(self, error: PolicyViolation, rule_type: str) -> str | None:
        """The field a refusal of the rule's spec names: a typed parameter's own field, one of
        the row's fields (label, counts, ...), else the parameters as a whole."""
        first = error.path.split(".", 1)[0]
        if is_typed(rule_type) and field_name(rule_type, first) in self.fields:
            return field_name(rule_type, first)
        if first in SPEC_FIELDS and first in self.fields:
            return first
        return "params" if "params" in self.fields else None

    @staticmethod
    def words_of(error: PolicyViolation) -> str:
        first = error.path.split(".", 1)[0]
        return error.reason if first in SPEC_FIELDS else str(error)

    def add_error(self, field, error):
        # The model's own validation (Rule.clean) checks this spec again, with the same
        # invariant: once this form has put a refusal on the field it names, the model's
        # copy of it (on `params`, or on the row's field) is not said twice. Its other errors
        # (a label too long, while a parameter was refused first) still are.
        if self.refused and field is None and hasattr(error, "error_dict"):
            said = {message for errors in self.errors.values() for message in errors}
            fresh = {
                name: kept
                for name, errors in error.error_dict.items()
                if (kept := [e for e in errors if not set(e.messages) <= said])
            }
            if not fresh:
                return
            error = ValidationError(fresh)
        super().add_error(field, error)
