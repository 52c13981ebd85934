// The console's connection: JSON-RPC 2.0 over the `/v1/rpc` WebSocket, authenticated by
// `hello` (browsers cannot set an Authorization header on a WebSocket). The token lives in
// this object only — never in storage — so closing or reloading the page signs out.

export const PROTOCOL = 1;

/// An error answered by the server (or the transport), by its typed code.
export class RpcError extends Error {
  constructor(code, data) {
    super(code);
    this.code = code;
    this.data = data || {};
  }
}

/// What a person reads for each typed error code (the server's `message` is never shown).
const WORDING = {
  'unauthorized': 'Not signed in, or the credential is not valid (revoked, expired or mistyped).',
  'forbidden': 'Your role does not allow this.',
  'not-found': 'Not found (it may have been removed).',
  'bad-params': 'The request was not valid',
  'unsupported-protocol': 'This server speaks another protocol version.',
  'stale-revision': 'Someone changed this in the meantime; it has been reloaded — try again.',
  'turn-busy': 'A turn is already running.',
  'turn-not-running': 'That turn is no longer running.',
  'workspace-offline': 'The workspace’s worker is offline.',
  'operation-conflict': 'This operation was already done with other values.',
  'operation-in-progress': 'The same operation is still in progress; try again shortly.',
  'rate-limited': 'Too many requests; wait a moment and try again.',
  'payload-too-large': 'That is too large.',
  'history-cleared': 'The session’s history was cleared.',
  'unsupported': 'Not supported here.',
  'unavailable': 'Temporarily unavailable; try again.',
  'internal': 'The server failed to do this.',
  'conflict': 'This conflicts with the current state.',
  'queue-full': 'The queue is full.',
  'interaction-closed': 'This request was already answered or has expired.',
  'unknown-provider': 'Unknown model provider.',
  'unknown-model': 'Unknown model.',
  'base-url-not-allowed': 'A custom endpoint is not allowed for this provider.',
  'disconnected': 'Not connected to the server.',
  'login-failed': 'Sign-in failed: check the team, email and password.',
  'login-rate-limited': 'Too many sign-in attempts; wait a minute and try again.',
};

export function describe(err) {
  if (!(err instanceof RpcError)) return 'Unexpected error.';
  let text = WORDING[err.code] || `Error: ${err.code}.`;
  const d = err.data || {};
  const detail = ['field', 'reason', 'limit', 'max'].filter((k) => d[k] !== undefined).map((k) => `${k}: ${d[k]}`);
  if (detail.length) text += ` (${detail.join(', ')})`;
  return text;
}

/// Why the server closed the connection, for a person.
export function closeReason(ev) {
  if (ev.code === 1008 && ev.reason === 'revoked') return 'Your access was revoked or changed (credential revoked, user disabled, role changed, or sign-in expired).';
  if (ev.code === 1008) return 'The server refused the connection (not authenticated).';
  if (ev.code === 1001) return 'The server is shutting down.';
  if (ev.code === 1009) return 'A message was too large.';
  return 'The connection to the server was lost.';
}

export class Connection {
  constructor() {
    this.ws = null;
    this.nextId = 1;
    this.pending = new Map();
    this.subs = new Map();
    this.onclose = null;
    this.me = null;
  }

  /// Open the socket and sign in with `token` (a credential or a login JWT).
  async open(token) {
    const url = new URL('/v1/rpc', location.href);
    url.protocol = location.protocol === 'https:' ? 'wss:' : 'ws:';
    const ws = new WebSocket(url);
    this.ws = ws;
    await new Promise((resolve, reject) => {
      ws.addEventListener('open', resolve, { once: true });
      ws.addEventListener('error', () => reject(new RpcError('disconnected')), { once: true });
    });
    ws.addEventListener('message', (ev) => this.receive(ev.data));
    ws.addEventListener('close', (ev) => this.closed(ev));
    this.me = await this.call('hello', { protocol: PROTOCOL, token, client: { name: 'berth-console', version: '1' } });
    return this.me;
  }

  close() {
    if (this.ws) {
      this.onclose = null;
      this.ws.close(1000);
    }
  }

  receive(text) {
    let msg;
    try { msg = JSON.parse(text); } catch { return; }
    if (msg.method === 'subscription.item') {
      const sub = this.subs.get(msg.params?.id);
      if (sub) sub.onItem(msg.params.item);
      return;
    }
    const p = this.pending.get(msg.id);
    if (!p) return;
    this.pending.delete(msg.id);
    this.subs.delete(msg.id);
    if (msg.error) p.reject(new RpcError(msg.error.data?.code || 'internal', msg.error.data));
    else p.resolve(msg.result);
  }

  closed(ev) {
    for (const p of this.pending.values()) p.reject(new RpcError('disconnected'));
    this.pending.clear();
    this.subs.clear();
    if (this.onclose) this.onclose(ev);
  }

  send(method, params) {
    const id = this.nextId++;
    const done = new Promise((resolve, reject) => this.pending.set(id, { resolve, reject }));
    if (!this.ws || this.ws.readyState !== WebSocket.OPEN) {
      this.pending.delete(id);
      return { id, done: Promise.reject(new RpcError('disconnected')) };
    }
    this.ws.send(JSON.stringify({ jsonrpc: '2.0', id, method, params: params || {} }));
    return { id, done };
  }

  call(method, params) {
    return this.send(method, params).done;
  }

  /// Start a subscription; `onItem` gets each item. Returns `{done, close()}`: `done`
  /// settles with the subscription's final value.
  subscribe(method, params, onItem) {
    const { id, done } = this.send(method, params);
    this.subs.set(id, { onItem });
    return {
      done,
      close: () => {
        this.subs.delete(id);
        this.call('subscription.close', { id }).catch(() => {});
      },
    };
  }
}

/// `POST /v1/auth/login` → a short-lived JWT.
export async function login(tenant, email, password) {
  let res;
  try {
    res = await fetch('/v1/auth/login', {
      method: 'POST',
      headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ tenant, email, password }),
      credentials: 'omit',
    });
  } catch {
    throw new RpcError('disconnected');
  }
  if (res.status === 429) throw new RpcError('login-rate-limited');
  if (!res.ok) throw new RpcError('login-failed');
  return (await res.json()).token;
}
