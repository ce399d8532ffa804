// The OpenID provider the sign-in tests run as a separate process on loopback: panva's
// certified node-oidc-provider with its built-in development login form (any password is
// accepted for a configured account; a test account's claims come from the config file).
//
//   node provider.mjs CONFIG.json    -> prints "ready <issuer>" once it listens
//
// CONFIG: {"port": N, "clients": [{client_id, client_secret, redirect_uris}],
//          "accounts": {"<login>": {<claims: email, email_verified, groups, ...>}}}
import { generateKeyPairSync } from 'node:crypto';
import { readFileSync } from 'node:fs';

import Provider from 'oidc-provider';

const config = JSON.parse(readFileSync(process.argv[2], 'utf8'));
// The issuer may name a front (a test proxy) other than the port the provider listens on.
const issuer = config.issuer || `http://127.0.0.1:${config.port}`;

function signingKey(type, options, kid, alg) {
  const { privateKey } = generateKeyPairSync(type, options);
  return { ...privateKey.export({ format: 'jwk' }), kid, alg, use: 'sig' };
}

const provider = new Provider(issuer, {
  clients: config.clients.map((c) => ({
    ...c,
    grant_types: ['authorization_code', 'urn:ietf:params:oauth:grant-type:device_code'],
    response_types: ['code'],
    token_endpoint_auth_method: c.token_endpoint_auth_method || 'client_secret_basic',
    id_token_signed_response_alg: c.id_token_signed_response_alg || 'RS256',
  })),
  jwks: {
    keys: [
      signingKey('rsa', { modulusLength: 2048 }, 'op-rsa-1', 'RS256'),
      signingKey('ec', { namedCurve: 'P-256' }, 'op-ec-1', 'ES256'),
    ],
  },
  cookies: { keys: ['test-provider-cookie-key'] },
  claims: {
    openid: ['sub'],
    email: ['email', 'email_verified'],
    profile: ['preferred_username', 'name'],
    groups: ['groups'],
  },
  scopes: ['openid', 'email', 'profile', 'groups'],
  // Claims of the granted scopes go into the ID token as well (not only userinfo), unless the
  // config asks for the conforming behaviour (scope claims from userinfo only).
  conformIdTokenClaims: Boolean(config.conform),
  pkce: { required: () => true },
  features: { devInteractions: { enabled: true }, deviceFlow: { enabled: true } },
  // First-party client: the grant is implied, so the only page a person sees is the login form.
  async loadExistingGrant(ctx) {
    const grant = new ctx.oidc.provider.Grant({
      clientId: ctx.oidc.client.clientId,
      accountId: ctx.oidc.session.accountId,
    });
    grant.addOIDCScope('openid email profile groups');
    grant.addOIDCClaims(['email', 'email_verified', 'groups', 'preferred_username', 'name']);
    await grant.save();
    return grant;
  },
  async findAccount(ctx, id) {
    const claims = config.accounts[id];
    if (!claims) return undefined;
    return { accountId: id, async claims() { return { sub: id, ...claims }; } };
  },
  ttl: {
    AccessToken: 300, AuthorizationCode: 60, DeviceCode: 600, IdToken: 300, Interaction: 600,
    Session: 3600, Grant: 3600,
  },
});
provider.proxy = false;

const server = provider.listen(config.port, '127.0.0.1', () => {
  process.stdout.write(`ready ${issuer}\n`);
});
process.on('SIGTERM', () => server.close(() => process.exit(0)));
