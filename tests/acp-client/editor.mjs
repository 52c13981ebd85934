// An editor built on the official ACP client (`@agentclientprotocol/sdk` from the npm
// registry) driving `berth acp`: initialize → session/new → session/prompt with a
// permission request answered → a prompt cancelled. The SDK checks every message it reads
// against the ACP schema. Prints one JSON line with what it saw; exits non-zero on failure.
//
// node editor.mjs SDK_NODE_MODULES BERTH_BIN SERVER TOKEN_FILE CWD
import { spawn } from "node:child_process";
import { createRequire } from "node:module";
import { join } from "node:path";
import { Readable, Writable } from "node:stream";
import { pathToFileURL } from "node:url";

const [modules, berth, server, tokenFile, cwd] = process.argv.slice(2);
const require = createRequire(join(modules, "resolve.js"));
const acp = await import(pathToFileURL(require.resolve("@agentclientprotocol/sdk")).href);

function check(ok, what) {
  if (!ok) throw new Error(`check failed: ${what}`);
}

const child = spawn(berth, ["acp", "--server", server, "--token-file", tokenFile], {
  stdio: ["pipe", "pipe", "inherit"],
});
const stream = acp.ndJsonStream(Writable.toWeb(child.stdin), Readable.toWeb(child.stdout));

const updates = [];
const permissions = [];
let watcher = () => {};
const app = acp
  .client({ name: "berth-e2e-editor" })
  .onNotification(acp.methods.client.session.update, ({ params }) => {
    updates.push(params);
    watcher(params);
  })
  .onRequest(acp.methods.client.session.requestPermission, ({ params }) => {
    permissions.push(params);
    const allow = params.options.find((o) => o.kind === "allow_once");
    return { outcome: { outcome: "selected", optionId: allow.optionId } };
  });

const seen = await app.connectWith(stream, async (ctx) => {
  const init = await ctx.request(acp.methods.agent.initialize, {
    protocolVersion: acp.PROTOCOL_VERSION,
    clientCapabilities: {},
  });
  check(init.protocolVersion === 1, "protocol version 1");
  const { sessionId } = await ctx.request(acp.methods.agent.session.new, { cwd, mcpServers: [] });

  const ran = await ctx.request(acp.methods.agent.session.prompt, {
    sessionId,
    prompt: [{ type: "text", text: "run it" }],
  });
  check(ran.stopReason === "end_turn", `end_turn, not ${ran.stopReason}`);

  const pondering = new Promise((resolve) => {
    watcher = (p) => {
      if (p.update.sessionUpdate === "agent_message_chunk" && p.update.content.text.includes("pondering")) resolve();
    };
  });
  const waiting = ctx.request(acp.methods.agent.session.prompt, {
    sessionId,
    prompt: [{ type: "text", text: "wait" }],
  });
  await pondering;
  await ctx.notify(acp.methods.agent.session.cancel, { sessionId });
  const cancelled = await waiting;
  return { sessionId, first: ran.stopReason, second: cancelled.stopReason };
});
child.stdin.end();

const kinds = updates.map((u) => u.update.sessionUpdate);
const ended = updates.find((u) => u.update.sessionUpdate === "tool_call_update" && u.update.status === "completed");
console.log(
  JSON.stringify({
    ...seen,
    kinds,
    permissions: permissions.map((p) => ({ toolCallId: p.toolCall.toolCallId, kind: p.toolCall.kind })),
    output: ended?.update.content?.[0]?.content?.text ?? null,
    text: updates
      .filter((u) => u.update.sessionUpdate === "agent_message_chunk")
      .map((u) => u.update.content.text)
      .join(""),
  }),
);
process.exit(0);
