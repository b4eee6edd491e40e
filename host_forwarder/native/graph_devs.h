/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The guest GPUs a graph's work goes to (graph_devs.c).  A graph is bound to no context: its
 * nodes are, each to the GPU it was made for, and a launch on one GPU's stream runs every node on
 * its own GPU.  So an executable graph's launch passes the scheduler of each GPU its nodes reach
 * (serve.c), which these sets record as the graph is built, captured, instantiated and updated.
 */
#ifndef VH_GRAPH_DEVS_H
#define VH_GRAPH_DEVS_H

#include <stdint.h>

struct vh_chan;

/* A set of guest GPUs: bit d for GPU d. */
typedef uint32_t vh_devs;

/* The set recorded for a graph or an executable graph (host object), 0 if none. */
vh_devs vh_graph_devs(const void *graph);
/* What a copy of graph g made now reaches (an executable graph, a child graph node, an update):
 * its set and, while captures are open, the GPUs they have put work on.  g may be a graph being
 * captured into, which gets those only as its capture ends, and the driver lets it be
 * instantiated or copied before (all but its destruction and node removal). */
vh_devs vh_graph_devs_copied(const void *graph);
/* Add to it (a node made for a GPU, a child graph's set, a capture's). */
void vh_graph_devs_add(const void *graph, vh_devs devs);
/* The object is gone. */
void vh_graph_devs_forget(const void *graph);
/* The guest GPU a node's context is (NULL: the current one's); -1 if none. */
int vh_ctx_dev(struct vh_chan *ch, CUcontext c);
/* The GPUs work was put on while a capture was open (serve.c adds them; a capture's end takes
 * them for its graph, and clears them once no capture is open). */
extern vh_devs vh_capture_devs;

#endif
