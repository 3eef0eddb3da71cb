#!/usr/bin/env python3
"""Drives `ds4-chat serve` with the official `openai` and `anthropic` packages through tool loops
(tests/app/serve_tools.rs starts the server).

  serve_tools_client.py script
      prints the scripted replies, one JSON list of texts, in the order `loop` asks for them
  serve_tools_client.py loop --base URL --model NAME
      against a server replying with the scripted turns (DS4_TEST_SERVE_SCRIPT)
  serve_tools_client.py plain --base URL --model NAME --key KEY
      plain requests of the anthropic client on the tiny model, with the API key

Every check prints one line; the last line is 'N passed, N failed' and the exit status is 0 only
when nothing failed.
"""

import argparse
import http.client
import json
import urllib.parse

import anthropic
import openai

from serve_checks import check, run_checks

DSML = "｜DSML｜"


def calls(*cities):
    invokes = "\n".join(
        f'<{DSML}invoke name="get_weather">\n<{DSML}parameter name="city" string="true">{c}</{DSML}parameter>\n</{DSML}invoke>'
        for c in cities
    )
    return f"\n\n<{DSML}tool_calls>\n{invokes}\n</{DSML}tool_calls>"


MALFORMED = f'Here: <{DSML}tool_calls>\n<{DSML}invoke name="get_weather">\nbroken</{DSML}invoke>\n</{DSML}tool_calls>'

# The model's replies, in the order the checks below make their requests. A thinking turn's text
# is its reasoning, `</think>`, then the answer.
SCRIPT = [
    "The user asks for Paris.</think>" + calls("Paris"),
    "Got 18 C.</think>It is 18 C and cloudy in Paris.",
    "Streaming this time.</think>Let me check." + calls("Paris"),
    "Done.</think>Paris: 18 C.",
    "Two cities.</think>" + calls("Paris", "Tokyo"),
    "Oops.</think>" + MALFORMED,
    "I should call the tool.</think>" + calls("Paris"),
    "Now answer.</think>It is 18 C in Paris.",
    "Streamed thought.</think>" + calls("Tokyo"),
    "Answering.</think>Tokyo: 25 C.",
    "Alpha beta STOP gamma delta",
]

OPENAI_TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}]
ANTHROPIC_TOOLS = [{
    "name": "get_weather",
    "description": "Current weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}]
QUESTION = "What's the weather in Paris?"


def raw(args, path, body, headers=None):
    """(status, text) of one POST."""
    u = urllib.parse.urlparse(args.base)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    conn.request("POST", path, body=json.dumps(body), headers=headers or {"Content-Type": "application/json"})
    r = conn.getresponse()
    text = r.read().decode("utf-8", "replace")
    conn.close()
    return r.status, text


def oa(args):
    return openai.OpenAI(base_url=args.base + "/v1", api_key="none", max_retries=0, timeout=120)


def an(args, key="none"):
    return anthropic.Anthropic(base_url=args.base, api_key=key, max_retries=0, timeout=120)


def openai_loop(args):
    c = oa(args)
    messages = [{"role": "user", "content": QUESTION}]
    # 0: a call, not streamed.
    r = c.chat.completions.create(model=args.model, messages=messages, tools=OPENAI_TOOLS)
    m = r.choices[0].message
    check("openai: finish_reason tool_calls", r.choices[0].finish_reason == "tool_calls", r)
    check("openai: one call of get_weather", m.tool_calls and len(m.tool_calls) == 1
          and m.tool_calls[0].function.name == "get_weather", m)
    check("openai: arguments are the city", json.loads(m.tool_calls[0].function.arguments) == {"city": "Paris"}, m)
    check("openai: the call has an id", m.tool_calls[0].id.startswith("call_"), m)
    check("openai: no text besides the call", m.content is None, m)
    check("openai: reasoning_content", getattr(m, "reasoning_content", None) == "The user asks for Paris.", m)
    first_prompt = r.usage.prompt_tokens
    # 1: the result goes back; the model answers.
    messages += [
        {"role": "assistant", "content": m.content, "tool_calls": [t.model_dump() for t in m.tool_calls]},
        {"role": "tool", "tool_call_id": m.tool_calls[0].id, "content": "18 C, cloudy"},
    ]
    r = c.chat.completions.create(model=args.model, messages=messages, tools=OPENAI_TOOLS)
    check("openai: answer after the result", r.choices[0].message.content == "It is 18 C and cloudy in Paris.", r)
    check("openai: finish_reason stop", r.choices[0].finish_reason == "stop", r)
    cached = r.usage.prompt_tokens_details.cached_tokens
    check("openai: the turn with the result reuses the cached call turn",
          cached >= first_prompt and cached < r.usage.prompt_tokens, (cached, first_prompt, r.usage))

    # 2: a call, streamed.
    messages = [{"role": "user", "content": QUESTION}]
    content, reasoning, finish, calls_seen = "", "", None, {}
    for chunk in c.chat.completions.create(model=args.model, messages=messages, tools=OPENAI_TOOLS, stream=True):
        if not chunk.choices:
            continue
        d = chunk.choices[0].delta
        content += d.content or ""
        reasoning += getattr(d, "reasoning_content", None) or ""
        for t in d.tool_calls or []:
            slot = calls_seen.setdefault(t.index, {"id": None, "name": "", "arguments": ""})
            slot["id"] = t.id or slot["id"]
            slot["name"] += t.function.name or ""
            slot["arguments"] += t.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    check("openai stream: text before the call", content == "Let me check.", content)
    check("openai stream: reasoning", reasoning == "Streaming this time.", reasoning)
    check("openai stream: one call delta with id and arguments", len(calls_seen) == 1
          and calls_seen[0]["id"].startswith("call_") and json.loads(calls_seen[0]["arguments"]) == {"city": "Paris"},
          calls_seen)
    check("openai stream: finish_reason tool_calls", finish == "tool_calls", finish)
    # 3: the result goes back, streamed answer.
    call = calls_seen[0]
    messages += [
        {"role": "assistant", "content": content, "tool_calls": [
            {"id": call["id"], "type": "function", "function": {"name": call["name"], "arguments": call["arguments"]}}]},
        {"role": "tool", "tool_call_id": call["id"], "content": "18 C"},
    ]
    text = "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
        model=args.model, messages=messages, tools=OPENAI_TOOLS, stream=True) if ch.choices)
    check("openai stream: answer after the result", text == "Paris: 18 C.", text)

    # 4: parallel calls.
    r = c.chat.completions.create(model=args.model, messages=[{"role": "user", "content": "Paris and Tokyo?"}],
                                  tools=OPENAI_TOOLS, tool_choice="required")
    tc = r.choices[0].message.tool_calls or []
    check("openai: parallel calls", [json.loads(t.function.arguments)["city"] for t in tc] == ["Paris", "Tokyo"], r)
    check("openai: parallel calls have distinct ids", len({t.id for t in tc}) == 2, tc)
    # 5: a malformed call is text, not an error.
    r = c.chat.completions.create(model=args.model, messages=[{"role": "user", "content": "Again?"}], tools=OPENAI_TOOLS)
    check("openai: a malformed call comes back as text", r.choices[0].message.content == MALFORMED
          and not r.choices[0].message.tool_calls and r.choices[0].finish_reason == "stop", r)


def anthropic_loop(args):
    c = an(args)
    thinking = {"type": "enabled", "budget_tokens": 2048}
    messages = [{"role": "user", "content": QUESTION}]
    # 6: a call, not streamed.
    r = c.messages.create(model="claude-any", max_tokens=200, messages=messages, tools=ANTHROPIC_TOOLS,
                          thinking=thinking)
    kinds = [b.type for b in r.content]
    check("anthropic: thinking then tool_use", kinds == ["thinking", "tool_use"], r)
    check("anthropic: stop_reason tool_use", r.stop_reason == "tool_use", r)
    use = r.content[-1]
    check("anthropic: tool_use input", use.name == "get_weather" and use.input == {"city": "Paris"}, use)
    check("anthropic: tool_use id", use.id.startswith("toolu_"), use)
    check("anthropic: usage", r.usage.input_tokens > 0 and r.usage.output_tokens > 0, r.usage)
    first_prompt = r.usage.input_tokens + (r.usage.cache_read_input_tokens or 0)
    # 7: the result goes back.
    messages += [
        {"role": "assistant", "content": [b.model_dump() for b in r.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "18 C"}]},
    ]
    r = c.messages.create(model="claude-any", max_tokens=200, messages=messages, tools=ANTHROPIC_TOOLS,
                          thinking=thinking)
    check("anthropic: answer after the result", r.content[-1].type == "text"
          and r.content[-1].text == "It is 18 C in Paris.", r)
    check("anthropic: stop_reason end_turn", r.stop_reason == "end_turn", r)
    check("anthropic: cache_read_input_tokens covers the call turn",
          (r.usage.cache_read_input_tokens or 0) >= first_prompt, (r.usage, first_prompt))

    # 8: a call, streamed.
    messages = [{"role": "user", "content": "And Tokyo?"}]
    seen = []
    with c.messages.stream(model="claude-any", max_tokens=200, messages=messages, tools=ANTHROPIC_TOOLS,
                           thinking=thinking) as s:
        for event in s:
            seen.append(event.type if event.type != "content_block_delta" else event.delta.type)
        final = s.get_final_message()
    for kind in ["message_start", "content_block_start", "thinking_delta", "input_json_delta",
                 "content_block_stop", "message_delta", "message_stop"]:
        check(f"anthropic stream: {kind} event", kind in seen, seen)
    check("anthropic stream: final message has the call", final.stop_reason == "tool_use"
          and final.content[-1].type == "tool_use" and final.content[-1].input == {"city": "Tokyo"}, final)
    check("anthropic stream: thinking text", final.content[0].type == "thinking"
          and final.content[0].thinking == "Streamed thought.", final)
    # 9: the result goes back, streamed answer.
    messages += [
        {"role": "assistant", "content": [b.model_dump() for b in final.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": final.content[-1].id,
                                      "content": [{"type": "text", "text": "25 C"}]}]},
    ]
    with c.messages.stream(model="claude-any", max_tokens=200, messages=messages, tools=ANTHROPIC_TOOLS,
                           thinking=thinking) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    check("anthropic stream: answer after the result", text == "Tokyo: 25 C.", text)
    check("anthropic stream: end_turn and usage", final.stop_reason == "end_turn"
          and final.usage.output_tokens > 0 and (final.usage.cache_read_input_tokens or 0) > 0, final)
    # 10: a stop sequence, thinking off.
    r = c.messages.create(model="claude-any", max_tokens=50, messages=[{"role": "user", "content": "Say it."}],
                          thinking={"type": "disabled"}, stop_sequences=["STOP"])
    check("anthropic: stop sequence", r.stop_reason == "stop_sequence" and r.stop_sequence == "STOP"
          and r.content[0].text == "Alpha beta ", r)


def bad_input(args):
    user = [{"role": "user", "content": "q"}]
    cases = [
        ("tools[0].function.parameters", {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]}),
        ("tools[0].function.name", {"tools": [{"type": "function", "function": {"name": "bad name"}}]}),
        ("tool_choice", {"tools": OPENAI_TOOLS, "tool_choice": "sometimes"}),
        ("tool_choice", {"tools": OPENAI_TOOLS, "tool_choice": {"type": "function", "function": {"name": "other"}}}),
    ]
    for param, extra in cases:
        status, text = raw(args, "/v1/chat/completions", {"model": args.model, "messages": user, **extra})
        body = json.loads(text)
        check(f"openai 400 names {param}", status == 400 and body["error"]["param"] == param and "\n" not in text, text)
    status, text = raw(args, "/v1/chat/completions", {"model": args.model, "messages": user + [
        {"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "content": "r"}]})
    check("openai 400: a tool message without tool_call_id", status == 400
          and json.loads(text)["error"]["param"] == "messages[2].tool_call_id", text)
    try:
        oa(args).chat.completions.create(model=args.model, messages=user, tools=OPENAI_TOOLS, tool_choice="sometimes")
        check("openai client: BadRequestError for an unknown tool_choice", False, "no error")
    except openai.BadRequestError as e:
        check("openai client: BadRequestError for an unknown tool_choice", "tool_choice" in str(e), e)
    status, text = raw(args, "/v1/messages", {"model": "m", "messages": user})
    body = json.loads(text)
    check("anthropic 400 in Anthropic's error shape", status == 400 and body["type"] == "error"
          and body["error"]["type"] == "invalid_request_error" and "max_tokens" in body["error"]["message"], text)
    for what, extra in [("tool schema", {"tools": [{"name": "f", "input_schema": "x"}]}),
                        ("tool_choice", {"tools": ANTHROPIC_TOOLS, "tool_choice": {"type": "sometimes"}}),
                        ("tool_result without id", {"messages": [{"role": "user", "content": [{"type": "tool_result", "content": "r"}]}]})]:
        try:
            an(args).messages.create(**{"model": "m", "max_tokens": 5, "messages": user, **extra})
            check(f"anthropic client: BadRequestError for a bad {what}", False, "no error")
        except anthropic.BadRequestError as e:
            check(f"anthropic client: BadRequestError for a bad {what}", e.status_code == 400, e)


def plain(args):
    key = args.key
    c = an(args, key)
    system = "You are a careful assistant. " * 60
    first = [{"role": "user", "content": "Tell me about the sea."}]
    r = c.messages.create(model=args.model, max_tokens=8, system=system, messages=first)
    check("anthropic plain: a reply", r.type == "message" and r.role == "assistant"
          and r.stop_reason in ("end_turn", "max_tokens") and 0 < r.usage.output_tokens <= 8, r)
    prompt = r.usage.input_tokens + (r.usage.cache_read_input_tokens or 0)
    follow = first + [{"role": "assistant", "content": [b.model_dump() for b in r.content]},
                      {"role": "user", "content": "And about the sky?"}]
    with c.messages.stream(model=args.model, max_tokens=8, system=system, messages=follow) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    check("anthropic plain stream: text and usage", final.usage.output_tokens > 0
          and (text == "".join(b.text for b in final.content if b.type == "text")), final)
    check("anthropic plain stream: the first turn is read from the cache",
          (final.usage.cache_read_input_tokens or 0) >= prompt, (final.usage, prompt))
    try:
        an(args, key + "x").messages.create(model=args.model, max_tokens=4, messages=[{"role": "user", "content": "hi"}])
        check("anthropic: AuthenticationError for a wrong x-api-key", False, "no error")
    except anthropic.AuthenticationError as e:
        check("anthropic: AuthenticationError for a wrong x-api-key", e.status_code == 401, e)
    status, text = raw(args, "/v1/messages", {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]},
                       headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}",
                                "anthropic-version": "2023-06-01"})
    check("anthropic: a Bearer key works too", status == 200 and json.loads(text)["type"] == "message", text)
    status, text = raw(args, "/v1/messages", {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
    check("anthropic: no key is 401 in Anthropic's shape", status == 401
          and json.loads(text)["error"]["type"] == "authentication_error", text)
    r = openai.OpenAI(base_url=args.base + "/v1", api_key=key, max_retries=0).chat.completions.create(
        model=args.model, max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    check("openai plain: a reply with the same key", r.usage.completion_tokens > 0, r)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["script", "loop", "plain"])
    p.add_argument("--base")
    p.add_argument("--model")
    p.add_argument("--key")
    args = p.parse_args()
    if args.mode == "script":
        print(json.dumps(SCRIPT, ensure_ascii=False))
        return

    def checks():
        if args.mode == "loop":
            openai_loop(args)
            anthropic_loop(args)
            bad_input(args)
        else:
            plain(args)

    run_checks(checks)


if __name__ == "__main__":
    main()
