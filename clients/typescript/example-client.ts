// A tiny Berth client over a browser/Node WebSocket, typed by berth-protocol.d.ts.
// It exists to prove the declarations are usable (`tsc --strict` checks it in the tests);
// the `@ts-expect-error` lines prove that wrong params and results are refused.

import type {
  Methods,
  MethodName,
  Subscriptions,
  WatchItem,
  WireError,
} from "./berth-protocol";

type Pending = { resolve: (v: unknown) => void; reject: (e: WireError) => void };

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

  subscribe<S extends keyof Subscriptions & MethodName>(
    method: S,
    params: Methods[S]["params"],
    onItem: (item: Subscriptions[S]) => void,
  ): Promise<Methods[S]["result"]> {
    const id = this.nextId;
    this.items.set(id, (item) => onItem(item as Subscriptions[S]));
    return this.call(method, params);
  }
}

export async function demo(client: BerthClient): Promise<string> {
  await client.call("hello", { protocol: 1, token: "berth_…" });
  const workspaces = await client.call("workspace.list", {});
  const session = await client.call("session.create", { workspaceId: workspaces[0].workspaceId });
  const sent = await client.call("session.send", { sessionId: session.sessionId, prompt: "hi" });
  let text = "";
  await client.subscribe("session.watch", { sessionId: session.sessionId, after: 0 }, (item: WatchItem) => {
    if ("sequence" in item) {
      if (item.type === "turn.ended" && item.turnId === sent.turnId) {
        text += `\n[${item.state}]`;
      }
    } else if (item.type === "model.delta") {
      text += item.text ?? "";
    }
  });
  // @ts-expect-error: session.send needs a prompt
  await client.call("session.send", { sessionId: session.sessionId });
  // @ts-expect-error: no such method
  await client.call("session.nope", {});
  // @ts-expect-error: a snapshot's phase is "idle" | "running"
  const phase: number = session.phase;
  return text + String(phase);
}
