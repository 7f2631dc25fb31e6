"""A pydantic-ai agent against a live `speclm serve` (docs/server.md#tool-calls): two tools,
tool_choice "auto" (pydantic-ai's default), prompts that ask for a tool; prints every turn
and whether the agent called a tool and finished with text. Then one request with
tool_choice "required" and parallel calls, which must end by itself (`tool_calls`, not
`length`). Run it from a virtualenv with pydantic-ai-slim[openai]:

    python scripts/clients_pydantic_ai.py --base-url http://127.0.0.1:8000/v1 [--log bodies.jsonl]"""

from __future__ import annotations


try:  # openai 3 speaks through httpx2
    import httpx2 as httpx
except ImportError:
    import httpx
from openai import AsyncOpenAI
from pydantic_ai import Agent, ModelRequest
from pydantic_ai.direct import model_request_sync
from pydantic_ai.models import ModelRequestParameters
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from client_args import parse

PROMPTS = ["What is the weather in Paris right now?",
           "Convert 250 US dollars to euros.",
           "Is it raining in Tokyo? Check the weather.",
           "How many Japanese yen do I get for 80 euros?"]
RATES = {("USD", "EUR"): 0.92, ("EUR", "JPY"): 162.0, ("EUR", "USD"): 1.09}


def build_agent(model: OpenAIChatModel) -> Agent:
    agent = Agent(model, instructions="You are a helpful assistant. Use the tools when they help, "
                                      "then answer the user in one sentence.")

    @agent.tool_plain
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        return f"{city}: 18 °C, light rain"

    @agent.tool_plain
    def convert_currency(amount: float, source: str, target: str) -> str:
        """Convert an amount of money between currencies given as ISO codes (USD, EUR, JPY)."""
        rate = RATES.get((source.upper(), target.upper()))
        return f"{amount * rate:.2f} {target.upper()}" if rate else f"no rate for {source}->{target}"

    return agent


def show(messages) -> tuple[bool, bool]:
    """Prints the turns; returns (a tool was called, the run ended with text)."""
    called = False
    for m in messages:
        for part in m.parts:
            kind = part.part_kind
            called |= kind == "tool-call"
            body = part.args if kind == "tool-call" else getattr(part, "content", "")
            print(f"    {kind:12} {getattr(part, 'tool_name', '') or ''} {str(body)[:160]!r}")
    last = messages[-1].parts
    return called, any(p.part_kind == "text" for p in last)


def main() -> None:
    args, log = parse(__doc__)

    async def record(request: httpx.Request) -> None:
        if log:
            log.write(request.content.decode() + "\n")
    http = httpx.AsyncClient(event_hooks={"request": [record]}, timeout=600)
    client = AsyncOpenAI(base_url=args.base_url, api_key="unused", http_client=http, max_retries=0)
    model = OpenAIChatModel(args.model, provider=OpenAIProvider(openai_client=client))
    agent = build_agent(model)
    settings = {"temperature": 0, "max_tokens": 300}
    done = 0
    for prompt in PROMPTS:
        print(f"prompt: {prompt}")
        result = agent.run_sync(prompt, model_settings=settings)
        called, finished = show(result.all_messages())
        done += called and finished
        print(f"  called a tool: {called}; finished with text: {finished}")
    print(f"auto: {done}/{len(PROMPTS)} called a tool and finished")

    tools = [t.tool_def for t in agent._function_toolset.tools.values()]
    response = model_request_sync(
        model, [ModelRequest.user_text_prompt("What is the weather in Paris and in Rome, and what are 100 USD in EUR?")],
        model_settings={**settings, "tool_choice": "required", "parallel_tool_calls": True},
        model_request_parameters=ModelRequestParameters(function_tools=tools, allow_text_output=True))
    calls = [p for p in response.parts if p.part_kind == "tool-call"]
    for c in calls:
        print(f"    tool-call    {c.tool_name} {c.args}")
    print(f"required+parallel: {len(calls)} calls, finish_reason {response.finish_reason}")


if __name__ == "__main__":
    main()
