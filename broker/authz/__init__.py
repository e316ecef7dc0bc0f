"""Authorization: ACL bindings (model), the decision (authorizer), their etcd records (store)."""
