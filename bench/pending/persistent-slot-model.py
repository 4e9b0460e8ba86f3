#!/usr/bin/env python3
"""An event model of the persistent step's slot protocol on the bulk path, one block, for the
one-warp-a-tile patch (persistent-one-warp-a-tile.patch).

The streaming lane fills positions in stream order (a run's tiles in groups, a group's slots stage by
stage with its tiles in turn), each into slot P % stages once the slot's previous position has been
released; its copy lands after a random delay, so copies complete out of order. Math warp w takes tile
w of each group, waiting on a full mbarrier by parity; the warps meet at each run's end. The model
counts waits that pass while the slot holds another position's bytes, and runs that never finish.

    python3 bench/pending/persistent-slot-model.py

prints, for each ring size, the outcome with one full barrier a slot (the first build, which failed
to launch in session 51) and with two a slot and groups of at most `stages` tiles (the patch).
"""
import random


class MBarrier:
    """An mbarrier: `count` arrivals and the expected transaction bytes complete a phase."""

    def __init__(self, count):
        self.count, self.pending, self.phase, self.tx = count, count, 0, 0

    def arrive(self, tx=0):
        self.tx += tx
        self.pending -= 1
        self._complete()

    def complete_tx(self, n):
        self.tx -= n
        self._complete()

    def _complete(self):
        if self.pending == 0 and self.tx == 0:
            self.phase += 1
            self.pending = self.count

    def passed(self, parity):
        """try_wait.parity: true once the phase of that parity has completed."""
        return (self.phase & 1) != parity


def stream_order(ops, per_tile, gmax):
    """Each position's warp and run: runs are consecutive tiles of one op, cut into groups."""
    owner, run, i, r = [], [], 0, 0
    while i < len(ops):
        n = 1
        while n < gmax and i + n < len(ops) and ops[i + n] == ops[i]:
            n += 1
        for _ in range(per_tile[ops[i]]):
            for w in range(n):
                owner.append(w)
                run.append(r)
        i += n
        if i >= len(ops) or ops[i] != ops[i - 1]:
            r += 1
    return owner, run


def simulate(stages, bars, owner, run, seed, warps=8, limit=30000):
    rnd = random.Random(seed)
    positions = len(owner)
    full = [MBarrier(1) for _ in range(bars)]
    empty = [MBarrier(1) for _ in range(stages)]
    slot = [None] * stages
    in_flight, issued = [], 0
    mine = {w: [p for p in range(positions) if owner[p] == w] for w in range(warps)}
    taken = {w: 0 for w in range(warps)}
    left = {}
    for p in range(positions):
        left[run[p]] = left.get(run[p], 0) + 1
    wrong, t = 0, 0
    while sum(left.values()) > 0 and t < limit:
        t += 1
        if issued < positions:
            s, fills = issued % stages, issued // stages
            if fills == 0 or empty[s].passed((fills - 1) & 1):
                full[issued % bars].arrive(tx=1)
                in_flight.append((t + rnd.randint(1, 60), issued))
                issued += 1
        for landed in [c for c in in_flight if c[0] <= t]:
            in_flight.remove(landed)
            p = landed[1]
            slot[p % stages] = p
            full[p % bars].complete_tx(1)
        for w in rnd.sample(range(warps), warps):
            if taken[w] >= len(mine[w]):
                continue
            p = mine[w][taken[w]]
            if any(left[q] for q in range(run[p])):
                continue  # the warps meet at a run's end
            if full[p % bars].passed((p // bars) & 1):
                wrong += slot[p % stages] != p
                empty[p % stages].arrive()
                taken[w] += 1
                left[run[p]] -= 1
    return t < limit, wrong


def main():
    # Runs of 10, 3, 9, 2, 5 and 17 tiles of 5, 4, 5, 10, 1 and 2 slots each.
    ops = [0] * 10 + [1] * 3 + [2] * 9 + [3] * 2 + [4] * 5 + [5] * 17
    per_tile = {0: 5, 1: 4, 2: 5, 3: 10, 4: 1, 5: 2}
    seeds = range(5)
    for stages in (3, 5, 8, 12):
        for name, bars, gmax in (
            ("one barrier a slot, groups of 8", stages, 8),
            ("two a slot, groups of min(8, stages)", 2 * stages, min(8, stages)),
        ):
            owner, run = stream_order(ops, per_tile, gmax)
            results = [simulate(stages, bars, owner, run, seed) for seed in seeds]
            hangs = sum(not done for done, _ in results)
            bad = sum(wrong > 0 for _, wrong in results)
            print(f"{stages:2d} slots, {name}: {bad} of {len(results)} runs read a wrong slot, {hangs} never finish",
                  flush=True)


if __name__ == "__main__":
    main()
