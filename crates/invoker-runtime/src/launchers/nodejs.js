// The nodejs launcher of the invoker's action runtime (actionloop protocol).
// argv: [node, launcher.js, main], or [node, --snapshot-blob, blob, main] when the kind starts
// from a V8 startup snapshot of this file (`[kinds] snapshot`; built by the process factory
// with `node --build-snapshot`, which runs everything but `start`). With `@wait-for-action` in
// place of main, the launcher was started before its action existed (with the runtime, in a
// stem): the entry point and the action's environment come as the first line on stdin, at
// /init once index.js is written (see start). The action is index.js in
// the working directory: a plain `function main(params)` or `exports.main`/`module.exports`.
// Writes {"ok":true} on fd 3 once loaded, then one result line per stdin line; a returned
// Promise is awaited, a returned generator streamed (see stream). Answers follow OpenWhisk's nodejs runtime (see runOnce). Writes to pipes are synchronous on Linux, so the action's output precedes
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

let main;

function start() {
  // Required here, not above: node does not vouch for readline's state inside a snapshot.
  const readline = require('readline');
  const input = readline.createInterface({ input: process.stdin, terminal: false });
  const entry = process.argv[process.argv.length - 1] || 'main';
  if (entry !== '@wait-for-action') {
    serve(entry, input);
    return;
  }
  // Node's start and this file's (most of a node cold start) are paid while the container
  // waits for its /init, which hands over only what is the action's.
  input.once('line', (line) => {
    let first = {};
    try {
      first = JSON.parse(line);
    } catch (_) {}
    Object.assign(process.env, first.env || {});
    serve(first.main || 'main', input);
  });
}

function serve(entry, input) {
  try {
    main = load(entry);
  } catch (err) {
    console.error(err && err.stack ? err.stack : String(err));
    reply({ error: 'Initialization failed: ' + String(err) });
    process.exit(1);
  }
  reply({ ok: true });
  installTagging();

  // Assigning to the real process.env calls glibc's setenv, which keeps every "NAME=value" string
  // it is ever given: with a new activation id and deadline per run, a warm action would leak
  // ~250 bytes per activation. A plain copy holds the same variables; child_process passes
  // process.env to the children it starts, so they see the run's values too.
  process.env = Object.assign({}, process.env);

  let queue = Promise.resolve();
  input.on('line', (line) => {
    queue = queue.then(async () => {
      let message;
      try {
        message = JSON.parse(line);
        for (const [key, value] of Object.entries(message)) {
          if (key !== 'value' && typeof value === 'string') process.env['__OW_' + key.toUpperCase()] = value;
        }
      } catch (err) {
        return developer('An error has occurred: ' + String(err));
      }
      tag = message.tag_logs === true && typeof message.activation_id === 'string' ? message.activation_id + ' ' : '';
      try {
        await runOnce(message.value || {});
      } finally {
        endTagging();
      }
    });
  });
  input.on('close', () => queue.then(() => process.exit(0)));
}

// One activation, answered as OpenWhisk's nodejs runtime answers it (its runner.js and
// service.js): a throw from main is a developer error, "An error has occurred: <error>"; a
// rejected Promise is an application error holding the serialised reason ({} for none); a
// result that is not an object is a developer error; undefined is {}.
async function runOnce(params) {
  let returned;
  try {
    returned = main(params);
  } catch (err) {
    console.error(err);
    return developer('An error has occurred: ' + String(err));
  }
  if (isStream(returned)) return stream(returned);
  let result;
  try {
    result = await returned;
  } catch (err) {
    return answer({ error: err ? serializeError(err) : {} });
  }
  if (result === undefined) result = {};
  if (typeof result !== 'object') {
    console.error('Result must be of type object but has type "' + typeof result + '":', result);
    return developer('The action did not return a dictionary.');
  }
  answer(result);
}

// A generator or an async generator: its values are streamed, each a line ">" then its JSON
// as it is yielded, then a last line "=" then {} or {"error": ...} (invoker_wire::runtime::
// STREAM_TYPE). The write to fd 3 is synchronous: a full pipe holds the generator back.
function isStream(value) {
  return value !== null && typeof value === 'object' && typeof value.next === 'function' &&
    (typeof value[Symbol.asyncIterator] === 'function' || typeof value[Symbol.iterator] === 'function');
}

async function stream(values) {
  let end = {};
  try {
    for await (const value of values) {
      const json = JSON.stringify(value);
      fs.writeSync(3, '>' + (json === undefined ? 'null' : json) + '\n');
    }
  } catch (err) {
    console.error(err);
    end = { error: String(err && err.message !== undefined ? err.message : err) };
  }
  fs.writeSync(3, '=' + JSON.stringify(end) + '\n');
}

function answer(result) {
  try {
    reply(result);
  } catch (err) {
    console.error("The action's result is not JSON: " + String(err));
    reply(null);
  }
}

// A line that starts with '!' is a developer error for the runtime to answer with (its JSON
// after the mark), whatever the result would have been.
function developer(message) {
  fs.writeSync(3, '!' + JSON.stringify({ error: message }) + '\n');
}

// What the npm package serialize-error (9.1.0, which OpenWhisk's runtime uses) makes of a
// rejection's reason: own enumerable properties, nested objects likewise, circular references
// as "[Circular]", functions dropped, Buffers and streams named, then name, message, stack
// and code wherever they are strings.
function serializeError(value) {
  if (typeof value === 'function') return '[Function: ' + (value.name || 'anonymous') + ']';
  if (value === null || typeof value !== 'object') return value;
  return serializeObject(value, []);
}

function serializeObject(from, seen) {
  if (typeof from.toJSON === 'function') return from.toJSON();
  const to = Array.isArray(from) ? [] : {};
  seen.push(from);
  for (const [key, value] of Object.entries(from)) {
    if (Buffer.isBuffer(value)) to[key] = '[object Buffer]';
    else if (value !== null && typeof value === 'object' && typeof value.pipe === 'function') to[key] = '[object Stream]';
    else if (typeof value === 'function') continue;
    else if (!value || typeof value !== 'object') to[key] = value;
    else if (seen.includes(value)) to[key] = '[Circular]';
    else to[key] = serializeObject(value, seen.slice());
  }
  for (const property of ['name', 'message', 'stack', 'code']) {
    if (typeof from[property] === 'string') to[property] = from[property];
  }
  return to;
}

// When runs overlap on one container (the invoker asks with tag_logs), every line this process
// writes during a run starts with the run's activation id, so the invoker gives each line to
// the run that wrote it. One process runs one activation at a time, but several share the
// container's pipes: each line goes whole, in one write, so that no other process's output
// lands inside it (a line longer than 64 KiB goes in parts).
let tag = '';
const pending = { stdout: '', stderr: '' };
const writers = {};

// Called from start(): a snapshot is built without the process's streams.
function installTagging() {
  for (const name of ['stdout', 'stderr']) {
    const stream = process[name];
    const write = stream.write.bind(stream);
    writers[name] = write;
    stream.write = function (chunk, encoding, callback) {
      if (!tag) return write(chunk, encoding, callback);
      const text = pending[name] +
        (typeof chunk === 'string' ? chunk : Buffer.from(chunk).toString(typeof encoding === 'string' ? encoding : 'utf8'));
      let end = text.lastIndexOf('\n') + 1;
      if (end === 0 && text.length > 65536) end = text.length;
      pending[name] = text.slice(end);
      const done = typeof encoding === 'function' ? encoding : callback;
      if (end === 0) {
        if (done) process.nextTick(done);
        return true;
      }
      const lines = text.slice(0, end).split(/(?<=\n)/);
      return write(lines.map((line) => tag + line).join(''), 'utf8', done);
    };
  }
}

// What a run left of an unfinished line goes out, ended, so that the runtime's sentinel starts
// a line.
function endTagging() {
  for (const name of ['stdout', 'stderr']) {
    if (tag && pending[name]) writers[name](tag + pending[name] + '\n');
    pending[name] = '';
  }
  tag = '';
}

const { startupSnapshot } = require('v8');
if (startupSnapshot && startupSnapshot.isBuildingSnapshot()) {
  startupSnapshot.setDeserializeMainFunction(start);
} else {
  start();
}
