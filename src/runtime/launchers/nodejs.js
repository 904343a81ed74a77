// The nodejs launcher of the invoker's action runtime (actionloop protocol).
// argv: [node, launcher.js, main]. The action is index.js in the working directory: a plain
// `function main(params)` or `exports.main`/`module.exports`. Writes {"ok":true} on fd 3 once
// loaded, then one result line per stdin line; a returned Promise is awaited. Writes to pipes
// are synchronous on Linux, so the action's output precedes the runtime's sentinels.
'use strict';
const fs = require('fs');
const path = require('path');
const readline = require('readline');

function reply(obj) {
  fs.writeSync(3, JSON.stringify(obj) + '\n');
}

function load(entry) {
  const file = path.resolve('index.js');
  const source = fs.readFileSync(file, 'utf8');
  const module = { exports: {} };
  const wrapped = new Function('exports', 'require', 'module', '__filename', '__dirname',
    source + '\n;return typeof ' + entry + " === 'function' ? " + entry + ' : undefined;');
  const local = wrapped(module.exports, require, module, file, path.dirname(file));
  const fn = local || module.exports[entry] || (typeof module.exports === 'function' ? module.exports : undefined);
  if (typeof fn !== 'function') throw new Error("the action has no function named '" + entry + "'");
  return fn;
}

let main;
try {
  main = load(process.argv[2] || 'main');
} catch (err) {
  console.error(err && err.stack ? err.stack : String(err));
  reply({ error: 'Initialization failed: ' + String(err) });
  process.exit(1);
}
reply({ ok: true });

// Assigning to the real process.env calls glibc's setenv, which keeps every "NAME=value" string
// it is ever given: with a new activation id and deadline per run, a warm action would leak
// ~250 bytes per activation. A plain copy holds the same variables; child_process passes
// process.env to the children it starts, so they see the run's values too.
process.env = Object.assign({}, process.env);

const input = readline.createInterface({ input: process.stdin, terminal: false });
let queue = Promise.resolve();
input.on('line', (line) => {
  queue = queue.then(async () => {
    let result;
    try {
      const message = JSON.parse(line);
      for (const [key, value] of Object.entries(message)) {
        if (key !== 'value' && typeof value === 'string') process.env['__OW_' + key.toUpperCase()] = value;
      }
      // Anything but an object or an array goes to the runtime as it is: the runtime answers
      // it as a developer error, with the one message every kind gives.
      result = await main(message.value || {});
    } catch (err) {
      console.error(err && err.stack ? err.stack : String(err));
      result = { error: String(err && err.message ? err.message : err) };
    }
    try {
      reply(result);
    } catch (err) {
      console.error("The action's result is not JSON: " + String(err));
      reply(null);
    }
  });
});
input.on('close', () => queue.then(() => process.exit(0)));
