/* The plan's parts beyond its steps, parsed from the verified header
 * (plan.cc; C++, for model.cc): the Loops the data stops (schema 6) and
 * the arena plans for smaller sizes (size classes). Not installed. */
#ifndef COLDBREW_PLAN_H_
#define COLDBREW_PLAN_H_

#include "bundle_generated.h"
#include "bundle/model.h"

/* Every index of `v` names one of `n` tensors. */
bool cb_in_range(const flatbuffers::Vector<uint32_t>* v, uint32_t n);

/* After the steps are parsed: CB_OK, CB_ERR_CORRUPT naming what is out of place. */
cb_status cb_parse_loops(const coldbrew::schema::Bundle* b, cb_model* m, uint32_t version);
/* After the tensors (and their shape programs) are parsed. */
cb_status cb_parse_size_classes(const coldbrew::schema::Bundle* b, cb_model* m, uint32_t version);

#endif /* COLDBREW_PLAN_H_ */
