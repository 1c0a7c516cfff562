'use strict';
// A small Node.js client of lodestar's gRPC services: @grpc/grpc-js with the contracts loaded at run
// time from protos/ (the same .proto files the Python services are generated from; no generated code).
//
//   const { connect } = require('./lodestar');
//   const gateway = connect('GatewayService', '127.0.0.1:50052');
//   const { session } = await unary(gateway, 'OpenSession', { labels: { task: 't1' } });
//
// TLS: pass { tlsCa, tlsCert, tlsKey } (PEM file paths; a certificate makes it mutual TLS). The
// control-plane token ({ token }) is sent as `authorization: Bearer <token>` on every call.
// Field names are the .proto names (snake_case); enums are their names; 64-bit integers are strings.

const fs = require('fs');
const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const PROTO_ROOT = path.resolve(__dirname, '..', '..', 'protos');
const PROTO_FILES = ['gateway', 'inference', 'rollout', 'trainer'].map((name) => `lodestar/v1/${name}.proto`);
const DEFAULT_DEADLINE_MS = 30000;

let cached = null;

/** The `lodestar.v1` package: service constructors and message types. */
function loadPackage(protoRoot = process.env.LODESTAR_PROTO_ROOT || PROTO_ROOT) {
  if (cached === null) {
    const definition = protoLoader.loadSync(PROTO_FILES, {
      includeDirs: [protoRoot],
      keepCase: true,
      longs: String,
      enums: String,
      defaults: true,
      oneofs: true,
    });
    cached = grpc.loadPackageDefinition(definition).lodestar.v1;
  }
  return cached;
}

function channelCredentials({ tlsCa, tlsCert, tlsKey } = {}) {
  if (!tlsCa && !tlsCert) return grpc.credentials.createInsecure();
  const read = (file) => (file ? fs.readFileSync(file) : null);
  return grpc.credentials.createSsl(read(tlsCa), read(tlsKey), read(tlsCert));
}

/** A client of `service` ("GatewayService", "InferenceService", "RolloutService", "TrainerService"). */
function connect(service, target, options = {}) {
  const Client = loadPackage()[service];
  if (!Client) throw new Error(`unknown service ${service}`);
  const client = new Client(target, channelCredentials(options), {
    'grpc.max_receive_message_length': 256 * 1024 * 1024,
  });
  client.lodestarMetadata = () => {
    const metadata = new grpc.Metadata();
    if (options.token) metadata.set('authorization', `Bearer ${options.token}`);
    return metadata;
  };
  return client;
}

function deadline(ms) {
  return new Date(Date.now() + (ms || DEFAULT_DEADLINE_MS));
}

/** One unary call as a promise (rejects with the gRPC error: `.code`, `.details`). */
function unary(client, method, request, { timeoutMs } = {}) {
  return new Promise((resolve, reject) => {
    client[method](request, client.lodestarMetadata(), { deadline: deadline(timeoutMs) }, (error, reply) =>
      error ? reject(error) : resolve(reply),
    );
  });
}

/** A server-streaming call: `onMessage` for each reply; resolves with all replies when the stream ends. */
function serverStream(client, method, request, { timeoutMs, onMessage } = {}) {
  return new Promise((resolve, reject) => {
    const replies = [];
    const call = client[method](request, client.lodestarMetadata(), { deadline: deadline(timeoutMs) });
    call.on('data', (reply) => {
      replies.push(reply);
      if (onMessage) onMessage(reply);
    });
    call.on('error', reject);
    call.on('end', () => resolve(replies));
  });
}

/** A user message in the canonical chat format. */
function userMessage(text) {
  return { role: 'ROLE_USER', content: [{ text: { text } }] };
}

/**
 * InferenceService.Generate, streamed: returns { text, tokenIds, logprobs, final } where text is the
 * concatenation of the deltas and final the GenerateFinal message.
 */
async function generate(inference, request, options = {}) {
  let text = '';
  const tokenIds = [];
  const logprobs = [];
  let final = null;
  await serverStream(inference, 'Generate', { stream: true, ...request }, {
    ...options,
    onMessage: (reply) => {
      if (reply.delta) {
        text += reply.delta.text;
        tokenIds.push(...reply.delta.token_ids);
        logprobs.push(...reply.delta.logprobs);
      } else if (reply.final) {
        final = reply.final;
      }
    },
  });
  return { text, tokenIds, logprobs, final };
}

module.exports = { PROTO_ROOT, loadPackage, connect, unary, serverStream, generate, userMessage, grpc };
