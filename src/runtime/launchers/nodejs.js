// The nodejs launcher of the invoker's action runtime (actionloop protocol).
// argv: [node, launcher.js, main], or [node, --snapshot-blob, blob, main] when the kind starts
// from a V8 startup snapshot of this file (`[kinds] snapshot`; built by the process factory
// with `node --build-snapshot`, which runs everything but `start`). The action is index.js in
// the working directory: a plain `function main(params)` or `exports.main`/`module.exports`.
// Writes {"ok":true} on fd 3 once loaded, then one result line per stdin line; a returned
// Promise is awaited. Writes to pipes are synchronous on Linux, so the action's output precedes
// the runtime's sentinels.
'use strict';
const fs = require('fs');
const path = require('path');
const { createRequire } = require('module');

function reply(obj) {
  fs.writeSync(3, JSON.stringify(obj) + '\n');
}

// The action's `require` resolves from index.js, as a module's own would: a snapshot's entry
// script only has a `require` of built-in modules.
function load(entry) {
  const file = path.resolve('index.js');
  const source = fs.readFileSync(file, 'utf8');
  const module = { exports: {} };
  const wrapped = new Function('exports', 'require', 'module', '__filename', '__dirname',
    source + '\n;return typeof ' + entry + " === 'function' ? " + entry + ' : undefined;');
  const local = wrapped(module.exports, createRequire(file), module, file, path.dirname(file));
  const fn = local || module.exports[entry] || (typeof module.exports === 'function' ? module.exports : undefined);
  if (typeof fn !== 'function') throw new Error("the action has no function named '" + entry + "'");
  return fn;
}

function start() {
  let main;
  try {
    main = load(process.argv[process.argv.length - 1] || 'main');
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

  // Required here, not above: node does not vouch for readline's state inside a snapshot.
  const readline = require('readline');
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
}

const { startupSnapshot } = require('v8');
if (startupSnapshot && startupSnapshot.isBuildingSnapshot()) {
  startupSnapshot.setDeserializeMainFunction(start);
} else {
  start();
}
