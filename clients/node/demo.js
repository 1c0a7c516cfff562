#!/usr/bin/env node
'use strict';
// lodestar from Node.js: open a gateway session, stream one generation from inference, read a run from
// rollout, and print what came back as one JSON object.
//
//   node clients/node/demo.js --gateway 127.0.0.1:50052 --inference 127.0.0.1:50051 \
//        --rollout 127.0.0.1:50053 --run RUN_ID [--prompt TEXT] [--tls-ca ca.pem --tls-cert c.pem
//        --tls-key c-key.pem] [--token TOKEN]

const { connect, unary, generate, userMessage } = require('./lodestar');

function parseArgs(argv) {
  const args = { prompt: 'Say hello' };
  for (let i = 0; i < argv.length; i += 2) {
    const key = argv[i].replace(/^--/, '').replace(/-([a-z])/g, (_, c) => c.toUpperCase());
    args[key] = argv[i + 1];
  }
  return args;
}

async function main() {
  const args = parseArgs(process.argv.slice(2));
  const options = { tlsCa: args.tlsCa, tlsCert: args.tlsCert, tlsKey: args.tlsKey, token: args.token };
  const out = {};

  const gateway = connect('GatewayService', args.gateway, options);
  const opened = await unary(gateway, 'OpenSession', { run_id: args.run || '', labels: { client: 'node' } });
  out.session = { session_id: opened.session.session_id, has_key: opened.session.session_key.length > 0 };
  out.http_base_url = opened.http_base_url;

  const inference = connect('InferenceService', args.inference, options);
  const deltas = [];
  const generated = await generate(inference, {
    request_id: 'node-demo',
    messages: [userMessage(args.prompt)],
    sampling: { max_tokens: 64 },
  });
  out.generate = {
    text: generated.text,
    tokens: generated.tokenIds.length,
    logprobs: generated.logprobs.length,
    finish_reason: generated.final && generated.final.finish_reason,
    final_text: generated.final && generated.final.message.content.map((p) => (p.text ? p.text.text : '')).join(''),
  };

  if (args.rollout && args.run) {
    const rollout = connect('RolloutService', args.rollout, options);
    const { run } = await unary(rollout, 'GetRun', { run_id: args.run });
    out.run = { run_id: run.run_id, state: run.state, sessions_pending: run.sessions_pending };
  }
  for (const client of [gateway, inference]) client.close();
  process.stdout.write(`${JSON.stringify(out)}\n`);
}

main().catch((error) => {
  process.stderr.write(`lodestar node client: ${error.code !== undefined ? `${error.code} ` : ''}${error.details || error.message}\n`);
  process.exit(1);
});
