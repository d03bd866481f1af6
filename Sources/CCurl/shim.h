// Typed, non-variadic wrappers: Swift cannot call variadic C functions such as curl_easy_setopt.
#ifndef CSSP_CURL_SHIM_H
#define CSSP_CURL_SHIM_H
#include <curl/curl.h>

typedef size_t (*cssp_curl_data_cb)(char *ptr, size_t size, size_t nmemb, void *userdata);

static inline CURLcode cssp_curl_setopt_long(CURL *h, CURLoption o, long v) { return curl_easy_setopt(h, o, v); }
static inline CURLcode cssp_curl_setopt_ptr(CURL *h, CURLoption o, const void *v) { return curl_easy_setopt(h, o, v); }
static inline CURLcode cssp_curl_setopt_off(CURL *h, CURLoption o, curl_off_t v) { return curl_easy_setopt(h, o, v); }
static inline CURLcode cssp_curl_setopt_data_cb(CURL *h, CURLoption o, cssp_curl_data_cb cb) { return curl_easy_setopt(h, o, cb); }
static inline long cssp_curl_response_code(CURL *h) {
    long code = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
    return code;
}
#endif
