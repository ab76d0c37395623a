"""A process of the replicated-state tests: coroutines incrementing counter variables with
fetch + store (compare-and-set), printing each acknowledged store as a JSON line
(`{"name", "version", "value"}`) as soon as it is acknowledged.

    python tests/state/state_worker.py ENDPOINTS --names 4 --ops 50 --coroutines 4 --seed 1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys

from rlog.client import AsyncClient
from rlog.client.errors import RlogError
from rlog.state import AsyncState, Variable


async def increment_until_stopped(
    state: AsyncState, names: list[str], ops: int, rng: random.Random, out: list[dict[str, object]]
) -> None:
    done = 0
    while ops <= 0 or done < ops:
        name = rng.choice(names)
        try:
            current = await state.fetch(name)
            value = int(current.value or b"0") + 1
            stored = await state.store(Variable(name, str(value).encode(), current.version))
        except RlogError as error:
            print(json.dumps({"error": str(error)}), file=sys.stderr, flush=True)
            await asyncio.sleep(0.1)
            continue
        done += 1
        if stored is not None:
            record = {"name": name, "version": stored.version, "value": value}
            out.append(record)
            print(json.dumps(record), flush=True)
        await asyncio.sleep(rng.random() * 0.01)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("endpoints")
    parser.add_argument("--names", type=int, default=4)
    parser.add_argument("--ops", type=int, default=50, help="per coroutine; 0: for ever")
    parser.add_argument("--coroutines", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--snapshot-every", type=int, default=10_000)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    names = [f"counter-{i}" for i in range(args.names)]
    out: list[dict[str, object]] = []
    client = AsyncClient(args.endpoints, append_timeout=20)
    async with AsyncState(client, snapshot_every=args.snapshot_every) as state:
        await asyncio.gather(
            *(
                increment_until_stopped(state, names, args.ops, random.Random(rng.random()), out)
                for _ in range(args.coroutines)
            )
        )
    await client.close()


if __name__ == "__main__":
    asyncio.run(main())
