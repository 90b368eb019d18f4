"""Errors as OpenAI's API reports them: an HTTP status and {"error": {message, type, param, code}}."""
from __future__ import annotations

from pydantic import ValidationError

# pydantic names the branch of a union it tried ("str", "list[TextPart]", ...) in an error's location;
# those are types, not parameters, and OpenAI's `param` names only parameters
_BRANCH_NAMES = {"str", "int", "float", "bool", "list", "dict", "none"}


class APIError(Exception):
    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def invalid(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def model_not_found(name: str) -> APIError:
    return APIError(404, f"The model `{name}` does not exist.", param="model", code="model_not_found")


def context_exceeded(ctx: int, n_prompt: int, param: str) -> APIError:
    return invalid(f"This model's maximum context length is {ctx} tokens. However, your {param} resulted in "
                   f"{n_prompt} tokens. Please reduce the length of the {param}.", param, "context_length_exceeded")


def server_error(message: str, status: int = 500) -> APIError:
    return APIError(status, message, type="server_error")


def from_validation(err: ValidationError) -> APIError:
    """The first problem pydantic found, naming the parameter as OpenAI does (messages[0].content)."""
    errors = err.errors(include_url=False)
    if errors[0]["type"] == "json_invalid":
        return invalid(f"We could not parse the JSON body of your request ({errors[0]['msg']}). The request "
                       "must be a JSON object.")
    # a union (str | list[...]) fails once per branch: a branch the input's type matched says the most;
    # when none did, the message lists what each branch wanted
    e = next((x for x in errors if not x["type"].endswith("_type")), errors[0])
    param = _param(e["loc"])
    if e["type"] == "missing":
        return invalid(f"Missing required parameter: '{param}'.", param)
    wanted = [x["msg"].removeprefix("Input should be ") for x in errors
              if x["type"].endswith("_type") and _param(x["loc"]) == param]
    msg = "Input should be " + " or ".join(dict.fromkeys(wanted)) if e["type"].endswith("_type") else e["msg"]
    if not param:
        return invalid(f"Invalid request body: {msg}.")
    return invalid(f"Invalid value for '{param}': {msg}.", param)


def _param(loc) -> str:
    param = ""
    for part in loc:
        if isinstance(part, int):
            param += f"[{part}]"
        elif part.lower() not in _BRANCH_NAMES and "[" not in part and "-" not in part:
            param += f".{part}" if param else part
    return param
