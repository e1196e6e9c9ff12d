# Built-in search and list scoping (interface: "Built-in default behaviour" 3 and 4).
#
# The service evaluates the whole package (data.memories.filter) and uses two of its rules:
#   namespace_prefix  replaces the requested prefix;
#   attribute_filter  is ANDed with the caller's filter.
# Both must be defined for every input: the service answers 500 policy_error when either is undefined (fail
# closed). A policy that constrains nothing says so: namespace_prefix := input.namespace_prefix, attribute_filter
# := {}.
#
# Admins (the role the service is configured with, ADMIN_ROLE, default "admin", passed as
# input.context.role_names.admin; the caller's roles are the flat jwt_claims.roles list) keep the requested prefix
# and get no attribute filter. Without role_names in the input nobody is an admin.
#
# Everyone else is confined to ["user", <user_id>] and always gets the attribute filter {"namespace": "user",
# "sub": <user_id>}. The effective prefix is the intersection of the requested subtree with the caller's own one:
#   - requested prefix inside the own subtree (["user", "alice", "notes"] for alice): kept as asked;
#   - requested prefix above it ([] or ["user"]): narrowed to ["user", "alice"];
#   - requested prefix disjoint from it (["user", "bob"], ["shared"]): the intersection is empty, so the answer is
#     ["user", "alice", ""]. Stored namespace segments are never empty, so this prefix (inside the caller's subtree,
#     compared segment by segment) matches nothing and the caller sees an empty result, the same answer as for a
#     namespace that holds nothing. We do not silently substitute the caller's own records: an agent asking for
#     bob's memories must not receive alice's as if they were bob's, and an empty answer reveals nothing about bob.
package memories.filter

import rego.v1

is_admin if input.context.role_names.admin in object.get(input, ["context", "jwt_claims", "roles"], [])

requested := object.get(input, "namespace_prefix", [])

# A missing user id becomes "", which no stored segment equals: fail closed rather than leaving rules undefined
# (an undefined namespace_prefix is a policy_error).
user_id := object.get(input, ["context", "user_id"], "")

own_prefix := ["user", user_id]

# Segment-exact prefix test: is `prefix` a leading part of `ns`?
has_prefix(ns, prefix) if {
	count(ns) >= count(prefix)
	every i, segment in prefix {
		ns[i] == segment
	}
}

namespace_prefix := requested if is_admin

namespace_prefix := requested if {
	not is_admin
	has_prefix(requested, own_prefix)
}

namespace_prefix := own_prefix if {
	not is_admin
	not has_prefix(requested, own_prefix)
	has_prefix(own_prefix, requested)
}

namespace_prefix := array.concat(own_prefix, [""]) if {
	not is_admin
	not has_prefix(requested, own_prefix)
	not has_prefix(own_prefix, requested)
}

attribute_filter := {} if is_admin

attribute_filter := {"namespace": "user", "sub": user_id} if not is_admin
