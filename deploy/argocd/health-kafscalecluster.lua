-- Argo CD health check for kafscale.io/KafScaleCluster.
-- Healthy once the operator has observed the current generation and reports Ready;
-- Degraded when it reports Degraded; Suspended when scaled to zero; Progressing otherwise.
local hs = {}
if obj.status == nil or obj.status.observedGeneration == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to reconcile the cluster"
  return hs
end
if obj.metadata.generation ~= nil and obj.status.observedGeneration < obj.metadata.generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to reconcile generation " .. obj.metadata.generation
  return hs
end
local ready, degraded, progressing = nil, nil, nil
if obj.status.conditions ~= nil then
  for _, condition in ipairs(obj.status.conditions) do
    if condition.type == "Ready" then
      ready = condition
    elseif condition.type == "Degraded" then
      degraded = condition
    elseif condition.type == "Progressing" then
      progressing = condition
    end
  end
end
if degraded ~= nil and degraded.status == "True" then
  hs.status = "Degraded"
  hs.message = degraded.reason .. ": " .. (degraded.message or "")
  return hs
end
if ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  hs.message = ready.message or "All brokers ready"
  return hs
end
if ready ~= nil and ready.reason == "ScaledToZero" then
  hs.status = "Suspended"
  hs.message = "The cluster is scaled to zero brokers"
  return hs
end
hs.status = "Progressing"
if progressing ~= nil and progressing.message ~= nil and progressing.message ~= "" then
  hs.message = progressing.message
elseif ready ~= nil then
  hs.message = ready.message or "Waiting for brokers"
else
  hs.message = "Waiting for brokers"
end
return hs
