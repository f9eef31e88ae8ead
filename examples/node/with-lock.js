// withLock whose fetch-like task is cancelled by the fence: the signal
// passed to the task aborts at the fence, before another holder can take
// the lock, so a request that honours it (fetch(url, { signal })) stops by
// itself. The network is cut with the embedded backend's fault switch.
//
//   node examples/node/with-lock.js
'use strict';

const dlock = require('../../bindings/node');

// Stands in for fetch(url, { signal }): a slow request that stops on abort.
function slowRequest(ms, { signal }) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => resolve('response'), ms);
    signal.addEventListener('abort', () => {
      clearTimeout(timer);
      reject(signal.reason);
    });
  });
}

async function main() {
  const service = new dlock.Service();
  const options = { service, ttl: 2000, keepaliveInterval: 500, keepaliveTimeout: 200, margin: 500 };
  const client = new dlock.Client(options);
  const other = new dlock.Client(options);

  try {
    await client.withLock('examples/node/report', { timeout: 5000 }, async ({ token, signal }) => {
      console.log(`holding token ${token}; starting a 10 s request`);
      const contender = other.lock('examples/node/report');
      contender.acquire().then((t) => console.log(`the other holder acquired token ${t}`));
      client.link.partition(); // our keepalives stop getting through
      return slowRequest(10_000, { signal });
    });
  } catch (e) {
    if (!(e instanceof dlock.FencedError)) throw e;
    console.log(`request cancelled at the fence: ${e.message}`);
  }
  // Wait until the other holder has it, then let it go.
  const again = other.lock('examples/node/report');
  await new Promise((r) => setTimeout(r, 1500));
  console.log(`the lock is now held with token ${service.holder('examples/node/report')}`);
  await again.close();
  process.exit(0);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
