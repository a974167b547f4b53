/* The lower layers of kvcal fit's configuration (kv_fit_config_base): defaults < the method's preset < the
 * configuration file, the method given on the command line over the file's. The file's method picks the
 * preset when no method is given, so the file is read twice: once for its method, once over the preset.
 * Flags and --set go on top (kv_fit_config_set), then kv_fit_config_validate. */
#include "kv_calib.h"

kv_status kv_fit_config_base(kv_fit_config *cfg, const char *config_path, int method) {
    kv_status s;
    const int given = method >= 0;
    if (!given && config_path) { /* the file's method picks the preset */
        kv_fit_config probe;
        if ((s = kv_fit_config_init(&probe)) != KV_OK) return s;
        s = kv_fit_config_load_file(&probe, config_path);
        method = (int)probe.method;
        kv_fit_config_free(&probe);
        if (s != KV_OK) return s;
    }
    if (method >= 0 && (s = kv_fit_config_method_preset(cfg, (kv_fit_method)method)) != KV_OK) return s;
    if (config_path && (s = kv_fit_config_load_file(cfg, config_path)) != KV_OK) return s;
    if (given) cfg->method = (kv_fit_method)method;
    return KV_OK;
}
