// A loopback TCP proxy in front of the server's live stream that cuts connections: each
// of the first `cuts` connections is destroyed (both sides) once `cutAfterBytes` bytes
// of its response body have gone through, mid-frame. It records every request's
// Last-Event-ID.
import { createConnection, createServer, type Server, type Socket } from "node:net";

export interface ProxiedRequest {
  /** The connection's number, from 1. */
  connection: number;
  path: string;
  lastEventId: string | undefined;
}

export interface CuttingProxy {
  url: string;
  requests: ProxiedRequest[];
  /** Connections cut so far. */
  cut(): number;
  /** Called with each request as it goes through. */
  onRequest: ((r: ProxiedRequest) => void) | undefined;
  close(): Promise<void>;
}

export async function cuttingProxy(upstreamPort: number, cuts: number, cutAfterBytes: number): Promise<CuttingProxy> {
  let connections = 0;
  let cutCount = 0;
  const sockets = new Set<Socket>();
  const proxy: CuttingProxy = {
    url: "",
    requests: [],
    cut: () => cutCount,
    onRequest: undefined,
    close: () =>
      new Promise((res) => {
        for (const s of sockets) s.destroy();
        server.close(() => res());
      }),
  };
  const server: Server = createServer((client) => {
    const number = ++connections;
    const upstream = createConnection({ host: "127.0.0.1", port: upstreamPort });
    sockets.add(client);
    sockets.add(upstream);
    const toCut = number <= cuts;
    let head = Buffer.alloc(0);
    client.on("data", (chunk: Buffer) => {
      head = Buffer.concat([head, chunk]);
      // Every request head on the connection (GETs carry no body).
      for (let end = head.indexOf("\r\n\r\n"); end >= 0; end = head.indexOf("\r\n\r\n")) {
        const lines = head.subarray(0, end).toString("latin1").split("\r\n");
        head = head.subarray(end + 4);
        const path = lines[0]?.split(" ")[1] ?? "";
        const header = lines.find((l) => /^last-event-id:/i.test(l));
        const request = { connection: number, path, lastEventId: header?.slice(header.indexOf(":") + 1).trim() };
        proxy.requests.push(request);
        proxy.onRequest?.(request);
      }
      upstream.write(chunk);
    });
    let bodyBytes = -1; // -1 until the response head has passed
    let pending = Buffer.alloc(0);
    upstream.on("data", (chunk: Buffer) => {
      if (!toCut) {
        client.write(chunk);
        return;
      }
      if (bodyBytes < 0) {
        pending = Buffer.concat([pending, chunk]);
        const end = pending.indexOf("\r\n\r\n");
        if (end < 0) return;
        chunk = pending.subarray(end + 4);
        client.write(pending.subarray(0, end + 4));
        bodyBytes = 0;
      }
      if (bodyBytes >= cutAfterBytes) return;
      const room = cutAfterBytes - bodyBytes;
      if (chunk.length < room) {
        bodyBytes += chunk.length;
        client.write(chunk);
        return;
      }
      client.write(chunk.subarray(0, room), () => {
        cutCount += 1;
        client.destroy();
        upstream.destroy();
      });
      bodyBytes = cutAfterBytes;
    });
    const end = () => {
      client.destroy();
      upstream.destroy();
      sockets.delete(client);
      sockets.delete(upstream);
    };
    client.on("error", end);
    upstream.on("error", end);
    client.on("close", end);
    upstream.on("close", end);
  });
  await new Promise<void>((res) => server.listen(0, "127.0.0.1", () => res()));
  const addr = server.address();
  proxy.url = `http://127.0.0.1:${typeof addr === "object" && addr ? addr.port : 0}`;
  return proxy;
}
