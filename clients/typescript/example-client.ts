// A tiny Berth client over a browser/Node WebSocket, typed by berth-protocol.d.ts.
// It exists to prove the declarations are usable (`tsc -p tsconfig.json` checks it in the
// tests, and a test runs `demo` against a real server); the `@ts-expect-error` lines prove
// that wrong params and results are refused.

import type {
  Methods,
  MethodName,
  Subscriptions,
  WatchItem,
  WireError,
} from "./berth-protocol";

type Pending = { resolve: (v: unknown) => void; reject: (e: WireError) => void };

/** A running subscription. */
export interface Subscription<R> {
  /** Its request id (what `subscription.item` names). */
  readonly id: number;
  /** Its final value: the request's answer once it ends (or its error). */
  readonly done: Promise<R>;
  /** End it early (`subscription.close`); `done` then settles. */
  close(): Promise<void>;
}

export class BerthClient {
  private nextId = 1;
  private pending = new Map<number, Pending>();
  private items = new Map<number, (item: unknown) => void>();

  constructor(private ws: WebSocket) {
    ws.onmessage = (ev: MessageEvent) => {
      const msg = JSON.parse(String(ev.data));
      if (msg.method === "subscription.item") {
        this.items.get(msg.params.id)?.(msg.params.item);
        return;
      }
      const p = this.pending.get(msg.id);
      if (!p) return;
      this.pending.delete(msg.id);
      if (msg.error) p.reject(msg.error as WireError);
      else p.resolve(msg.result);
    };
  }

  call<M extends MethodName>(method: M, params: Methods[M]["params"]): Promise<Methods[M]["result"]> {
    const id = this.nextId++;
    this.ws.send(JSON.stringify({ jsonrpc: "2.0", id, method, params }));
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve: (v) => resolve(v as Methods[M]["result"]), reject });
    });
  }

  /**
   * Start a subscription. Resolves once it has started (its first item has arrived, which
   * `onItem` has seen); rejects if the server refuses it first. Items keep arriving at
   * `onItem` until it ends (`done`).
   */
  subscribe<S extends keyof Subscriptions & MethodName>(
    method: S,
    params: Methods[S]["params"],
    onItem: (item: Subscriptions[S]) => void,
  ): Promise<Subscription<Methods[S]["result"]>> {
    const id = this.nextId;
    return new Promise((started, refused) => {
      let running = false;
      const subscription: Subscription<Methods[S]["result"]> = {
        id,
        done: this.call(method, params).finally(() => this.items.delete(id)),
        close: async () => {
          await this.call("subscription.close", { id });
        },
      };
      this.items.set(id, (item) => {
        onItem(item as Subscriptions[S]);
        if (!running) {
          running = true;
          started(subscription);
        }
      });
      // Ended (or refused) before any item: the caller learns it here.
      subscription.done.then(
        () => {
          if (!running) started(subscription);
        },
        (e: WireError) => {
          if (!running) refused(e);
        },
      );
    });
  }
}

/** Sign in, start a session, send a prompt and follow the watch until its turn ends. */
export async function demo(client: BerthClient, token: string): Promise<string> {
  await client.call("hello", { protocol: 1, token });
  const workspaces = await client.call("workspace.list", {});
  const session = await client.call("session.create", { workspaceId: workspaces[0].workspaceId });
  let text = "";
  let streamed = "";
  let ended: (state: string) => void = () => {};
  const end = new Promise<string>((resolve) => (ended = resolve));
  const watch = await client.subscribe("session.watch", { sessionId: session.sessionId, after: 0 }, (item: WatchItem) => {
    if ("sequence" in item) {
      // The answer as the history keeps it (live `model.delta` items stream it meanwhile).
      if (item.type === "model.completed") {
        text += (item.rows ?? []).filter((r) => r.kind === "assistant").map((r) => r.body).join("");
      }
      if (item.type === "turn.ended") ended(item.state);
    } else if (item.type === "model.delta") {
      streamed += item.text ?? "";
    }
  });
  // The watch is running: everything the (new session's only) turn does is seen.
  await client.call("session.send", { sessionId: session.sessionId, prompt: "hi" });
  const state = await end;
  await watch.close();
  await watch.done;
  return `${text}\n[${state}] (${streamed.length} bytes streamed)`;
}

/** Never called: what the declarations refuse. */
export async function refused(client: BerthClient): Promise<void> {
  const session = await client.call("session.get", { sessionId: "ses_x" });
  // @ts-expect-error: session.send needs a prompt
  await client.call("session.send", { sessionId: session.sessionId });
  // @ts-expect-error: no such method
  await client.call("session.nope", {});
  // @ts-expect-error: a snapshot's phase is "idle" | "running"
  const phase: number = session.phase;
  // SPEC gives `running` as null when no turn runs: a client checks for null.
  // @ts-expect-error: running may be null
  const running: string | undefined = session.running;
  const idle: boolean = session.running == null;
  void [phase, running, idle];
}
