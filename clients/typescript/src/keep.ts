// What keeps a Node process alive. The client's background handles (the live stream's
// sockets, heartbeats, reconnect backoff, a gate's polling and give-up timers) are
// unref'd: an idle or abandoned client holds nothing that pins the event loop, whether
// or not it was closed. A wait someone awaits holds one ref'd handle for as long as it
// waits — a follow while a `next()` is pending, a gate once its promise has a reaction
// (`await`, `then`, `catch`, `Promise.all`, …) — so Node neither exits under it nor
// reports an unsettled top-level await while the wait's only pending work is unref'd.

let holds = 0;
let keeper: ReturnType<typeof setInterval> | undefined;

/** Holds the process open until the returned function is called (idempotent). */
export function hold(): () => void {
  holds += 1;
  keeper ??= setInterval(() => {}, 1 << 30);
  let released = false;
  return () => {
    if (released) return;
    released = true;
    holds -= 1;
    if (holds === 0 && keeper !== undefined) {
      clearInterval(keeper);
      keeper = undefined;
    }
  };
}

/** The timer, unref'd where the runtime has `unref` (Node), so that it alone does not keep the process alive. */
export function unref<T>(timer: T): T {
  (timer as { unref?(): void } | undefined)?.unref?.();
  return timer;
}

/** A promise that tells when someone subscribes to it (its derived promises are plain ones). */
class Watched<T> extends Promise<T> {
  static override get [Symbol.species](): PromiseConstructor {
    return Promise;
  }

  /** @internal */
  onInterest: (() => void) | undefined;

  override then<A = T, B = never>(
    onfulfilled?: ((value: T) => A | PromiseLike<A>) | null,
    onrejected?: ((reason: unknown) => B | PromiseLike<B>) | null,
  ): Promise<A | B> {
    this.onInterest?.();
    return super.then(onfulfilled, onrejected);
  }
}

/**
 * `work`'s outcome, holding the process open from when someone subscribes to it
 * (`await`, `then`, …) until it settles. Nobody subscribed, `work` holds nothing open
 * by itself (its handles are unref'd): a script that leaves it ends.
 */
export function whileAwaited<T>(work: Promise<T>): Promise<T> {
  let settled = false;
  let release: (() => void) | undefined;
  const out = new Watched<T>((resolve, reject) => {
    work.then(
      (value) => {
        settled = true;
        release?.();
        resolve(value);
      },
      (err: unknown) => {
        settled = true;
        release?.();
        reject(err);
      },
    );
  });
  out.onInterest = () => {
    if (!settled && release === undefined) release = hold();
  };
  return out;
}

/**
 * `inner`'s items, holding the process open while a `next()` waits for one; between
 * items (the reader has one, or left) nothing is held. `return()` (or `throw()`) ends
 * `inner` too (its `finally` blocks run).
 */
export async function* heldWhileWaiting<T>(inner: AsyncGenerator<T, void, undefined>): AsyncGenerator<T, void, undefined> {
  try {
    for (;;) {
      const release = hold();
      let step: IteratorResult<T, void>;
      try {
        step = await inner.next();
      } finally {
        release();
      }
      if (step.done) return;
      yield step.value;
    }
  } finally {
    await inner.return(undefined);
  }
}
