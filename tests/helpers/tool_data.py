"""Tools shared by the tool-calling tests (the parser's, the real server's, LiteLLM's): two
function tools with finite argument schemas, a schema nested beyond the depth cap, a user message
that asks for both tools, and a model answer in the Hermes/Qwen call format that calls both."""

from __future__ import annotations

WEATHER = {"type": "object", "properties": {"city": {"enum": ["Paris", "Tokyo", "Lima"]},
           "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"city": {"enum": ["Paris", "Tokyo"]}, "utc": {"type": "boolean"}},
        "required": ["city", "utc"], "additionalProperties": False}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "description": "Time in a city", "parameters": TIME}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
DEEP: dict = {"type": "object"}
for _ in range(40):  # a valid schema nested beyond the depth cap (80 levels): a 400, never a RecursionError
    DEEP = {"type": "object", "properties": {"a": DEEP}}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris and the time in Tokyo?"}]
TEXT = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {"city": "Tokyo", "utc": false}}\n</tool_call>')
# get_time with one property, for the Responses and Messages tests: a forced call of a random model is
# mostly whitespace the grammar allows at each place, so each place costs tokens.
CITY_TIME = {"type": "object", "properties": {"city": {"enum": ["Paris", "Tokyo"]}}, "required": ["city"],
             "additionalProperties": False}
