#ifndef CSSP_CRYPTO_SHIM_H
#define CSSP_CRYPTO_SHIM_H
#include <openssl/evp.h>
#include <openssl/hmac.h>
#endif
