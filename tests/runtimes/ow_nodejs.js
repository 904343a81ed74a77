// A runtime that behaves as OpenWhisk's nodejs runtime (`app.js` of openwhisk-runtime-nodejs)
// does on the points the invoker must survive, written for the tests since that runtime comes
// from GitHub, which CI cannot reach. It takes no arguments and listens on :8080 of whatever
// network it is in.
// - node's HTTP server closes a kept-alive connection idle for `server.keepAliveTimeout`
//   (5 s by default; KEEP_ALIVE_MS here), also when the process was frozen past it;
// - one run at a time unless __OW_ALLOW_CONCURRENT=true: an overlapping /run gets 403
//   "System not ready, status is running." (service.js);
// - /init evaluates the code and takes `main` (or `exports.main`); /run exports the run's keys
//   as __OW_* variables, calls main, and writes the sentinels on stdout and stderr before it
//   answers; the action's own output goes untagged to the same streams;
// - an action that returns {"stream_forever": true} stands for one that replaced the runtime's
//   answer: the response is a body that never ends.
'use strict';
const http = require('http');

const allowConcurrent = process.env.__OW_ALLOW_CONCURRENT === 'true';
let main;
let running = 0;

function answer(res, status, body) {
  const data = JSON.stringify(body);
  res.writeHead(status, { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(data) });
  res.end(data);
}

function markers() {
  console.log('XXX_THE_END_OF_A_WHISK_ACTIVATION_XXX');
  console.error('XXX_THE_END_OF_A_WHISK_ACTIVATION_XXX');
}

function streamForever(res) {
  res.writeHead(200, { 'Content-Type': 'application/json' });
  const chunk = '[' + '"0123456789abcdef",'.repeat(4096);
  const more = () => {
    while (res.write(chunk)) {}
    res.once('drain', more);
  };
  res.on('close', () => res.removeAllListeners('drain'));
  more();
}

async function run(message, res) {
  for (const [key, value] of Object.entries(message)) {
    if (key !== 'value' && typeof value === 'string') process.env['__OW_' + key.toUpperCase()] = value;
  }
  let result;
  try {
    result = await main(message.value || {});
  } catch (err) {
    console.error(err);
    markers();
    return answer(res, 502, { error: 'An error has occurred: ' + String(err) });
  }
  markers();
  if (result && result.stream_forever) return streamForever(res);
  answer(res, 200, result === undefined ? {} : result);
}

const server = http.createServer((req, res) => {
  const chunks = [];
  req.on('data', (c) => chunks.push(c));
  req.on('end', () => {
    let message;
    try {
      message = JSON.parse(Buffer.concat(chunks).toString() || '{}');
    } catch (err) {
      return answer(res, 500, { error: 'Bad request.' });
    }
    if (req.url === '/init') {
      const value = message.value || {};
      try {
        main = eval('(function(){ ' + value.code + '\n return ' + (value.main || 'main') + ' })()');
      } catch (err) {
        return answer(res, 502, { error: 'Initialization has failed due to: ' + String(err) });
      }
      return answer(res, 200, { OK: true });
    }
    if (req.url === '/run' && main) {
      if (running > 0 && !allowConcurrent) {
        return answer(res, 403, { error: 'System not ready, status is running.' });
      }
      running += 1;
      res.on('close', () => { running -= 1; });
      return run(message, res);
    }
    answer(res, 500, { error: 'Bad request.' });
  });
});
server.keepAliveTimeout = Number(process.env.KEEP_ALIVE_MS || 5000);
server.timeout = 0;
server.listen(8080);
