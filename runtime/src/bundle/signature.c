/* Signed bundles: the Ed25519 signature check (coldbrew.h, cb_open_options).
 * The cryptography is libsodium's, opened at run time (libsodium.so.23) only
 * when an app asks for a signature, so the runtime depends on it only then. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "bundle/model.h"

typedef struct {
  int (*init)(void);
  int (*blake2b)(unsigned char* out, size_t outlen, const unsigned char* in, unsigned long long inlen,
                 const unsigned char* key, size_t keylen);
  int (*verify)(const unsigned char* sig, const unsigned char* m, unsigned long long mlen, const unsigned char* pk);
} cb_sodium;

static cb_sodium g_sodium;
static char g_sodium_error[256];
static pthread_once_t g_sodium_once = PTHREAD_ONCE_INIT;

static void sodium_load(void) {
  void* h = dlopen("libsodium.so.23", RTLD_NOW | RTLD_LOCAL);
  if (!h) h = dlopen("libsodium.so", RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    snprintf(g_sodium_error, sizeof g_sodium_error, "libsodium not found (%s): install libsodium23", dlerror());
    return;
  }
  cb_sodium s;
  *(void**)&s.init = dlsym(h, "sodium_init");
  *(void**)&s.blake2b = dlsym(h, "crypto_generichash_blake2b");
  *(void**)&s.verify = dlsym(h, "crypto_sign_ed25519_verify_detached");
  if (!s.init || !s.blake2b || !s.verify || s.init() < 0) {
    snprintf(g_sodium_error, sizeof g_sodium_error, "libsodium could not be initialised");
    return;
  }
  g_sodium = s; /* the library stays loaded for the process */
}

cb_status cb_signature_check(const uint8_t* p, uint64_t size, const uint8_t* key) {
  uint64_t at;
  memcpy(&at, p + 40, 8);
  if (at == 0) return cb_fail(CB_ERR_SIGNATURE, "bundle is not signed, and the app requires a signature");
  if (at < CB_PREAMBLE_SIZE || at > size || size - at != CB_SIG_BLOCK_SIZE ||
      memcmp(p + at, CB_SIG_MAGIC, 8) != 0)
    return cb_fail(CB_ERR_SIGNATURE, "bundle's signature block is malformed");
  const uint8_t* signer = p + at + 8;
  if (memcmp(signer, key, CB_PUBLIC_KEY_BYTES) != 0)
    return cb_fail(CB_ERR_SIGNATURE, "bundle is signed by another key (%02x%02x%02x%02x...), not the required one",
                   signer[0], signer[1], signer[2], signer[3]);
  pthread_once(&g_sodium_once, sodium_load);
  if (!g_sodium.verify) return cb_fail(CB_ERR_SIGNATURE, "cannot check the signature: %s", g_sodium_error);
  uint8_t msg[sizeof CB_SIG_CONTEXT + 32];
  memcpy(msg, CB_SIG_CONTEXT, sizeof CB_SIG_CONTEXT); /* with its terminating zero */
  if (g_sodium.blake2b(msg + sizeof CB_SIG_CONTEXT, 32, p, at, NULL, 0) != 0 ||
      g_sodium.verify(p + at + 8 + CB_PUBLIC_KEY_BYTES, msg, sizeof msg, key) != 0)
    return cb_fail(CB_ERR_SIGNATURE, "bundle signature does not verify: the bundle was altered after it was signed");
  return CB_OK;
}
