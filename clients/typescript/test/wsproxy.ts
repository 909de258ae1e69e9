// A loopback TCP proxy in front of the server that breaks WebSocket connections. Plain
// requests go through one per connection (`connection: close`), except `GET /api/live`,
// answered `{"websocket_url": null}` when `advertise` is off. A WebSocket upgrade
// (`GET /api/ws`) is refused with `wsStatus` when set; otherwise the server's frames are
// read one by one: while cuts are left, every `cutEvery`-th event frame of a connection is
// sent half and the connection destroyed; while drops are left, every `dropEvery`-th event
// frame is left out (the stream stays valid; the client sees a sequence skip ahead).
import { createConnection, createServer, type Server, type Socket } from "node:net";

export interface WsProxyOptions {
  advertise?: boolean;
  wsStatus?: number;
  /** Answers the SSE stream with this status. */
  streamStatus?: number;
  cutEvery?: number;
  maxCuts?: number;
  dropEvery?: number;
  maxDrops?: number;
}

export interface WsProxy {
  url: string;
  /** Every request's path (without its query) and its whole target. */
  paths: string[];
  targets: string[];
  cuts: number;
  drops: number;
  /** WebSocket connections opened through the proxy. */
  upgrades: number;
  close(): Promise<void>;
}

export async function wsProxy(upstreamPort: number, options: WsProxyOptions = {}): Promise<WsProxy> {
  const sockets = new Set<Socket>();
  const proxy: WsProxy = {
    url: "",
    paths: [],
    targets: [],
    cuts: 0,
    drops: 0,
    upgrades: 0,
    close: () =>
      new Promise((res) => {
        for (const s of sockets) s.destroy();
        server.close(() => res());
      }),
  };
  const answer = (client: Socket, status: number, body: string) => {
    client.end(`HTTP/1.1 ${status} X\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`);
  };
  const server: Server = createServer((client) => {
    sockets.add(client);
    client.on("close", () => sockets.delete(client));
    client.on("error", () => client.destroy());
    let head = Buffer.alloc(0);
    const onHead = (chunk: Buffer) => {
      head = Buffer.concat([head, chunk]);
      const end = head.indexOf("\r\n\r\n");
      if (end < 0) return;
      client.off("data", onHead);
      client.pause();
      const lines = head.subarray(0, end).toString("latin1").split("\r\n");
      const rest = head.subarray(end + 4);
      const target = lines[0]?.split(" ")[1] ?? "";
      const path = target.split("?")[0] ?? "";
      proxy.paths.push(path);
      proxy.targets.push(target);
      const websocket = path === "/api/ws";
      if (path === "/api/live" && options.advertise === false) return answer(client, 200, '{"websocket_url":null,"sse":true}');
      if (path.endsWith("/stream") && options.streamStatus !== undefined) return answer(client, options.streamStatus, '{"error":"no such route"}');
      if (websocket && options.wsStatus !== undefined) return answer(client, options.wsStatus, '{"error":"no such route"}');
      const out = websocket ? lines : [...lines.filter((l) => !/^connection:/i.test(l)), "connection: close"];
      const upstream = createConnection({ host: "127.0.0.1", port: upstreamPort });
      sockets.add(upstream);
      const end2 = () => {
        client.destroy();
        upstream.destroy();
        sockets.delete(upstream);
      };
      upstream.on("error", end2);
      upstream.on("close", end2);
      client.on("close", end2);
      upstream.write(Buffer.concat([Buffer.from(out.join("\r\n") + "\r\n\r\n", "latin1"), rest]));
      client.on("data", (c: Buffer) => upstream.write(c));
      client.resume();
      if (!websocket) {
        upstream.on("data", (c: Buffer) => client.write(c));
        return;
      }
      let buf = Buffer.alloc(0);
      let upgraded = false;
      let events = 0;
      upstream.on("data", (c: Buffer) => {
        buf = Buffer.concat([buf, c]);
        if (!upgraded) {
          const e = buf.indexOf("\r\n\r\n");
          if (e < 0) return;
          const status = buf.subarray(0, e).toString("latin1").split("\r\n")[0] ?? "";
          client.write(buf.subarray(0, e + 4));
          buf = buf.subarray(e + 4);
          if (!status.includes(" 101 ")) {
            upstream.removeAllListeners("data");
            upstream.on("data", (d: Buffer) => client.write(d));
            client.write(buf);
            return;
          }
          upgraded = true;
          proxy.upgrades += 1;
        }
        for (;;) {
          if (buf.length < 2) return;
          let size = buf[1]! & 0x7f;
          let at = 2;
          if (size === 126) {
            if (buf.length < 4) return;
            size = buf.readUInt16BE(2);
            at = 4;
          } else if (size === 127) {
            if (buf.length < 10) return;
            size = Number(buf.readBigUInt64BE(2));
            at = 10;
          }
          if (buf.length < at + size) return;
          const frame = buf.subarray(0, at + size);
          buf = buf.subarray(at + size);
          const isEvent = (frame[0]! & 0x0f) === 1 && frame.subarray(at).includes('"id":');
          if (isEvent) {
            events += 1;
            const cut = (options.cutEvery ?? 0) > 0 && events % options.cutEvery! === 0 && proxy.cuts < (options.maxCuts ?? 0);
            const drop = !cut && (options.dropEvery ?? 0) > 0 && events % options.dropEvery! === 0 && proxy.drops < (options.maxDrops ?? 0);
            if (cut) {
              proxy.cuts += 1;
              client.write(frame.subarray(0, Math.floor(frame.length / 2)), () => end2());
              upstream.removeAllListeners("data");
              return;
            }
            if (drop) {
              proxy.drops += 1;
              continue;
            }
          }
          client.write(frame);
        }
      });
    };
    client.on("data", onHead);
  });
  await new Promise<void>((res) => server.listen(0, "127.0.0.1", () => res()));
  const addr = server.address();
  proxy.url = `http://127.0.0.1:${typeof addr === "object" && addr ? addr.port : 0}`;
  return proxy;
}
