// The transport figures of docs/serving.md §4.10 for one `coli` binary (run it on the old and the
// new build to compare): answers over N connections to /health (half `Connection: close` from a
// reused set of client ports, half keep-alive with three requests), connect and answer times of
// 50 clients at once, and /health probes while one client holds 100 slow connections.
//
//   node bench/serve_transport_bench.mjs <path-to-coli> [connections=100000]
import net from 'node:net';
import path from 'node:path';
import { Server, demoModel, killAll, sleep } from '../tests/node/serve_util.mjs';

const coli = path.resolve(process.argv[2]);
const N = Number(process.argv[3] ?? 100000);
// The demo model of coli's build tree (built with the tests: tests/CMakeLists.txt).
const modelDir = demoModel(coli);

function exchange(port, text, { localPort = 0, timeoutMs = 3000 } = {}) {
  return new Promise((resolve) => {
    const t0 = performance.now();
    const parts = Array.isArray(text) ? text : [text];
    let sent = 1;
    let connectMs = null, buf = '', done = false;
    const sock = net.connect({ host: '127.0.0.1', port, ...(localPort ? { localPort } : {}) });
    const finish = (error) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      sock.destroy();
      resolve({ statuses: [...buf.matchAll(/HTTP\/1\.1 (\d{3})/g)].map((m) => Number(m[1])), error, connectMs, ms: performance.now() - t0 });
    };
    const timer = setTimeout(() => finish('timeout'), timeoutMs);
    sock.setEncoding('latin1');
    sock.on('connect', () => { connectMs = performance.now() - t0; sock.write(parts[0]); });
    sock.on('data', (d) => {
      buf += d;
      const n = parts.length;
      const answered = buf.split(/HTTP\/1\.1 \d{3}/).length - 1;
      if (!/\}\s*$/.test(buf)) return;
      if (answered >= n) finish(null);
      else if (answered > sent - 1) sock.write(parts[sent++]);
    });
    sock.on('error', (e) => finish(e.code ?? e.message));
    sock.on('close', () => finish(null));
  });
}
const HEALTH = 'GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n';
const HEALTH_CLOSE = 'GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n';
const pct = (a, p) => a.slice().sort((x, y) => x - y)[Math.min(a.length - 1, Math.floor(a.length * p))];

const srv = await new Server(coli, modelDir, 'bench', []).start();
{
  const counts = {};
  let next = 0, requests = 0;
  const t0 = performance.now();
  await Promise.all(Array.from({ length: 8 }, async (_, w) => {
    for (let i = next++; i < N; i = next++) {
      const close = i % 2 === 0;
      const expected = close ? 1 : 3;
      let r = await exchange(srv.port, close ? HEALTH_CLOSE : [HEALTH, HEALTH, HEALTH],
                             { localPort: close ? 40000 + w * 50 + ((i >> 1) % 50) : 0 });
      if (r.error === 'EADDRINUSE' || r.error === 'EADDRNOTAVAIL') r = await exchange(srv.port, close ? HEALTH_CLOSE : [HEALTH, HEALTH, HEALTH]);
      requests += expected;
      for (const s of r.statuses) counts[s] = (counts[s] ?? 0) + 1;
      if (r.statuses.length < expected) counts[`none (${r.error})`] = (counts[`none (${r.error})`] ?? 0) + expected - r.statuses.length;
    }
  }));
  const s = (performance.now() - t0) / 1000;
  console.log(`connections: ${N} (${requests} requests) in ${s.toFixed(1)} s: ${JSON.stringify(counts)}`);
}
{
  const connects = [], totals = [];
  for (let round = 0; round < 10; ++round) {
    const rs = await Promise.all(Array.from({ length: 50 }, () => exchange(srv.port, HEALTH_CLOSE, { timeoutMs: 10_000 })));
    for (const r of rs) { connects.push(r.connectMs ?? 10_000); totals.push(r.ms); }
  }
  console.log(`50 clients at once x10: connect p50 ${pct(connects, 0.5).toFixed(1)} ms, max ${Math.max(...connects).toFixed(0)} ms; answer p50 ${pct(totals, 0.5).toFixed(1)} ms, max ${Math.max(...totals).toFixed(0)} ms`);
}
await srv.stop();
{
  const slow = await new Server(coli, modelDir, 'slow', []).start();
  const sockets = [];
  for (let i = 0; i < 100; ++i) {
    const s = net.connect({ host: '127.0.0.1', port: slow.port });
    s.on('error', () => {});
    sockets.push(s);
    s.write('GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ');
  }
  const drip = setInterval(() => { for (const s of sockets) if (!s.destroyed) s.write('X'); }, 200);
  await sleep(1000);
  const probes = [];
  for (let i = 0; i < 20; ++i) probes.push(await exchange(slow.port, HEALTH_CLOSE, { timeoutMs: 5000 }));
  clearInterval(drip);
  const ok = probes.filter((p) => p.statuses[0] === 200).length;
  console.log(`/health under 100 slow connections (cap 64): ${ok}/20 answered; answered p50 ${pct(probes.filter((p) => p.statuses[0] === 200).map((p) => p.ms), 0.5)?.toFixed(1) ?? '-'} ms`);
  for (const s of sockets) s.destroy();
  await slow.stop();
}
killAll();
process.exit(0);
