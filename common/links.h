/* Link presets (configs/links.json, ballast-links/1): named links ("nvlink3", "pcie4",
 * "ib-hdr"), the link inside a node each device comes with, and the default network between
 * nodes; read by one-line planning (ballast plan --gpus). */
#ifndef BALLAST_LINKS_H
#define BALLAST_LINKS_H

#include "err.h"
#include "profile.h"

#define LINKS_NAME_MAX 32
#define LINKS_SOURCE_MAX 256

struct link_preset {
    char name[LINKS_NAME_MAX];
    struct link link;
    char source[LINKS_SOURCE_MAX];
};

struct link_table {
    int n;
    struct link_preset *links;
    int n_devices; /* "node_link": device -> preset */
    char (*device)[PROFILE_NAME_MAX];
    int *device_link;  /* index into links */
    int network;       /* index into links */
};

/* configs/links.json of the source tree (BALLAST_LINKS overrides it). */
const char *links_default_file(void);
int links_load(const char *file, struct link_table *t, struct err *e);
void links_free(struct link_table *t);
/* A preset by name, or NULL. */
const struct link_preset *links_find(const struct link_table *t, const char *name);
/* The link a device comes with inside a node, or NULL when the table gives none. */
const struct link_preset *links_node_link(const struct link_table *t, const char *device);
/* A rate given without a preset has this latency (the InfiniBand and PCIe presets'). */
#define LINKS_DEFAULT_LATENCY_US 5.0
/* `text` as a preset's name or a rate with or without a unit ("100Gbps", "50GB/s", "200":
 * Gbit/s; latency LINKS_DEFAULT_LATENCY_US). ERR_INPUT naming `what` (an option) and the
 * presets otherwise. *name_out: the preset's name, or NULL for a rate. */
int links_parse(const struct link_table *t, const char *text, const char *what, struct link *out,
                const char **name_out, struct err *e);

#endif
